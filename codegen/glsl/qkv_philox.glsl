// The first word of Philox4x32-10 as ir/random.hpp defines it for dropout masks: counter
// (index, 0, 0, 0), key (seed, $KEY1); umulExtended gives the 64-bit products.
uint qkv_philox(uint index, uint seed) {
  uvec4 c = uvec4(index, 0u, 0u, 0u);
  uvec2 k = uvec2(seed, $KEY1);
  for (int round = 0; round < 10; ++round) {
    uint hi0, lo0, hi1, lo1;
    umulExtended($M0, c.x, hi0, lo0);
    umulExtended($M1, c.z, hi1, lo1);
    c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k += uvec2($W0, $W1);
  }
  return c.x;
}
