  // Decoding (DECODE): the invocations share the rows, each with an online softmax over keys of
  // its own; the workgroup's result is their merge, per row the largest max and each partial
  // weighed by exp(m_i - max) (0 for one that met no key: its o is 0, or NaN where it met inf or
  // NaN in v, as the unsplit kernel's would be), in invocation order. Invocation 0 then holds
  // the rows.
  bool stores = true;
  if (DECODE != 0u) {
    [[unroll]] for (uint t = 0u; t < RPT; ++t) {
      barrier();  // the tiles are free: the last tile's reads, or the previous row's merge, are done
      k_tile[lid] = vec4(m[t], l[t], 0.0, 0.0);
      [[unroll]] for (uint g = 0u; g < DV4; ++g) v_tile[lid * DV4 + g] = o[t * DV4 + g];
      barrier();
      float mx = neg_inf();
      for (uint i = 0u; i < INV; ++i) mx = qkv_max(mx, k_tile[i].x);
      for (uint g = lid; g < DV4; g += INV) {  // column g is read and written by one invocation
        vec4 sum = vec4(0.0);
        for (uint i = 0u; i < INV; ++i) sum += merge_weight(k_tile[i].x, mx) * v_tile[i * DV4 + g];
        v_tile[g] = sum;
      }
      barrier();
      if (lid == 0u) {
        float sum = 0.0;
        for (uint i = 0u; i < INV; ++i) sum += merge_weight(k_tile[i].x, mx) * k_tile[i].y;
        m[t] = mx;
        l[t] = sum;
        [[unroll]] for (uint g = 0u; g < DV4; ++g) o[t * DV4 + g] = v_tile[g];
      }
    }
  }
  // Split over workgroups (SPLIT: few queries against many keys), each part hands its rows to
  // PARTIALS, and the last of a row block's parts to arrive (counted
  // atomically, as AMD's single-pass downsampler and CUDA's threadfence reduction do) merges them
  // all in part order, as above: the same bits whichever arrives last. PARTIALS holds an arrival
  // count per row block, then per block, part and row (RPT of them): m, l and o. Only the decode
  // layout splits (decode_split), so invocation 0 holds the rows.
  if (SPLIT != 0u) {
    uint per_batch = gl_NumWorkGroups.x / pc.parts, width = 4u * DV4 + 2u;
    uint block = b * per_batch + gl_WorkGroupID.x / pc.parts, first = per_batch * batches + block * pc.parts * RPT * width;
    if (lid == 0u) {
      uint at = first + gl_WorkGroupID.x % pc.parts * RPT * width;
      [[unroll]] for (uint t = 0u; t < RPT; ++t) {
        uint r = at + t * width;
        PARTIALS[r] = floatBitsToUint(m[t]);
        PARTIALS[r + 1u] = floatBitsToUint(l[t]);
        [[unroll]] for (uint g = 0u; g < DV4; ++g)
          [[unroll]] for (uint e = 0u; e < 4u; ++e) PARTIALS[r + 2u + 4u * g + e] = floatBitsToUint(o[t * DV4 + g][e]);
      }
    }
    memoryBarrierBuffer();  // the part's rows before its arrival
    barrier();
    if (lid == 0u) split_last[0] = atomicAdd(PARTIALS[block], 1u) == pc.parts - 1u ? 1u : 0u;
    barrier();
    memoryBarrierBuffer();
    stores = split_last[0] != 0u;  // uniform
    if (stores) {
      // The rows' columns over the invocations, gathered by invocation 0 through v_tile.
      [[unroll]] for (uint t = 0u; t < RPT; ++t) {
        float mx = neg_inf();
        for (uint p = 0u; p < pc.parts; ++p) mx = qkv_max(mx, uintBitsToFloat(PARTIALS[first + (p * RPT + t) * width]));
        for (uint g = lid; g < DV4; g += INV) {
          vec4 sum = vec4(0.0);
          for (uint p = 0u; p < pc.parts; ++p) {
            uint at = first + (p * RPT + t) * width, x = at + 2u + 4u * g;
            vec4 part = vec4(uintBitsToFloat(PARTIALS[x]), uintBitsToFloat(PARTIALS[x + 1u]), uintBitsToFloat(PARTIALS[x + 2u]), uintBitsToFloat(PARTIALS[x + 3u]));
            sum += merge_weight(uintBitsToFloat(PARTIALS[at]), mx) * part;
          }
          v_tile[g] = sum;
        }
        barrier();
        if (lid == 0u) {
          float sum = 0.0;
          for (uint p = 0u; p < pc.parts; ++p) {
            uint at = first + (p * RPT + t) * width;
            sum += merge_weight(uintBitsToFloat(PARTIALS[at]), mx) * uintBitsToFloat(PARTIALS[at + 1u]);
          }
          m[t] = mx;
          l[t] = sum;
          [[unroll]] for (uint g = 0u; g < DV4; ++g) o[t * DV4 + g] = v_tile[g];
        }
        barrier();
      }
    }
  }
  stores = stores && (DECODE == 0u || lid == 0u);
