// Every kernel the code generator emits for the registry's op cases compiles to SPIR-V.
#include <gtest/gtest.h>

#include "codegen/glsl.hpp"
#include "codegen/spirv.hpp"
#include "ir/error.hpp"
#include "ir/op_cases.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::codegen {
namespace {

TEST(Glsl, EveryOpCaseCompiles) {
  for (ir::Op op : ir::all_ops())
    for (const auto& c : ir::op_cases(op)) {
      ir::Graph g = ir::decompose_composites(ir::case_graph(op, c), implements);
      for (std::size_t i = 0; i < g.size(); ++i) {
        if (!has_kernel(g.nodes()[i])) continue;
        ASSERT_FALSE(unsupported_reason(g, g.nodes()[i]).has_value()) << ir::op_name(op);
        KernelSource k = kernel_source(g, static_cast<ir::ValueId>(i));
        auto words = compile_spirv(k.name, k.glsl);
        ASSERT_FALSE(words.empty());
        EXPECT_EQ(words[0], 0x07230203u) << "not SPIR-V";
      }
    }
}

TEST(Glsl, SourceDependsOnOpAndRankNotSizes) {
  auto source_for = [](std::vector<std::int64_t> shape) {
    ir::OpCase c{"x", {{shape}, {shape}}, {}};
    ir::Graph g = ir::case_graph(ir::Op::add, c);
    return kernel_source(g, g.output("out")).glsl;
  };
  EXPECT_EQ(source_for({3, 4}), source_for({30, 40}));
  EXPECT_NE(source_for({3, 4}), source_for({3, 4, 5}));
}

TEST(Glsl, EmitGraphNamesEachNode) {
  ir::Graph g = ir::case_graph(ir::Op::softmax, ir::op_cases(ir::Op::softmax)[0]);
  std::string s = emit_glsl(g);
  EXPECT_NE(s.find("// ---- %1 = softmax"), std::string::npos);
  EXPECT_NE(s.find("#version 450"), std::string::npos);
}

TEST(Spirv, CompileErrorsAreBackendErrors) {
  EXPECT_THROW(compile_spirv("broken", "#version 450\nvoid main() { nope(); }\n"), BackendError);
}

}  // namespace
}  // namespace qkv::codegen
