// Backend equivalence: one model, a pre-norm decoder block, on every backend against the float64
// reference, forward and backward, as the report table `qkv check` prints.
//   example_09_backend_equivalence [backend]
#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    auto x = input<"x">(dim<2>, dim<"T">, dim<16>);
    ir::Graph g = lower(named<"out">(decoder_block<"block", 16, 2, 32, Activation::gelu>(x)));
    auto in = backend::random_inputs(g, {{"T", 6}}, 9);
    for (auto& [name, t] : in)
      if (name.find("weight") != std::string::npos && name.find("norm") == std::string::npos)
        for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 0.3f;
    std::vector<std::string> backends = {"reference", "cpu"};
    if (be->name() != "reference" && be->name() != "cpu") backends.push_back(be->name());
    auto forward = backend::check_equivalence(g, in, backends);
    std::printf("forward:\n%s\n", forward.table().c_str());
    ir::Graph backward = ir::build_backward(g, {"", {"x", "block.self_attn.in_proj_weight", "block.linear1.weight"}, {"out"}});
    in.emplace("dout", backend::random_inputs(backward, {{"T", 6}}, 10).at("dout"));
    auto grads = backend::check_equivalence(backward, in, backends);
    std::printf("backward:\n%s\n", grads.table().c_str());
    std::printf("%s\n", forward.pass() && grads.pass() ? "every backend within its budget" : "FAILED");
    return forward.pass() && grads.pass() ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
