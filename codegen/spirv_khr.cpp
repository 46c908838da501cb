// SPV_NV_cooperative_matrix rewritten as SPV_KHR_cooperative_matrix, in the binary.
//
// Debian 12's glslang (11.13) compiles GL_NV_cooperative_matrix but not GL_KHR_cooperative_matrix,
// and AMD (RDNA3) and Intel (Arc) GPUs offer only VK_KHR_cooperative_matrix. The two extensions
// describe the same operations; what differs in SPIR-V:
//   - KHR's matrix types carry a use (A, B or accumulator), NV's do not: where an NV kernel
//     multiplies an A and a B fragment of one type (16 x 16 f16), KHR needs two types. Each
//     matrix-typed id gets the use of the multiply-add operand its values flow into (values,
//     variables, access chains and constants joined by data flow, a union-find), and every type
//     that holds matrices (the matrix, arrays of it, pointers to those) is declared once per use.
//   - Loads and stores take a layout constant (RowMajorKHR 0, ColumnMajorKHR 1) before the
//     stride, where NV takes a column-major boolean after it.
//   - The capability, the extension and the opcodes.
// A module using what this does not rewrite (matrices in structs, function parameters or return
// values, a value flowing into two uses, a non-constant layout) is an error, never a silent
// miscompile: glslang inlines every function of our kernels, which keep their fragments in
// variables and arrays of them.
#include <spirv-tools/libspirv.h>
#include <spirv/unified1/spirv.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "codegen/spirv.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

// SPV_KHR_cooperative_matrix's enumerants (SPIR-V 1.6 rev. 3 grammar; Debian 12's headers
// predate it).
constexpr std::uint32_t kCapabilityKhr = 6022;
constexpr std::uint32_t kOpTypeKhr = 4456, kOpLoadKhr = 4457, kOpStoreKhr = 4458, kOpMulAddKhr = 4459, kOpLengthKhr = 4460;
constexpr std::array<const char*, 3> kUseNames{"A", "B", "accumulator"};
constexpr std::uint32_t kAccumulator = 2;

struct Instruction {
  std::vector<std::uint32_t> words;
  std::uint32_t type = 0, result = 0;
  std::vector<std::uint16_t> ids;  // word offsets of operands that refer to values (not types)
  std::uint32_t opcode() const { return words[0] & 0xffffu; }
};

struct Module {
  std::array<std::uint32_t, 5> header{};
  std::vector<Instruction> instructions;
};

Module parse(const std::vector<std::uint32_t>& words) {
  Module m;
  if (words.size() < 5) throw BackendError("SPIR-V to KHR cooperative matrices: a module of " + std::to_string(words.size()) + " words");
  std::copy_n(words.begin(), 5, m.header.begin());
  spv_context context = spvContextCreate(SPV_ENV_VULKAN_1_1);
  spv_diagnostic diagnostic = nullptr;
  auto on_instruction = [](void* user, const spv_parsed_instruction_t* p) {
    Instruction in;
    in.words.assign(p->words, p->words + p->num_words);
    in.type = p->type_id;
    in.result = p->result_id;
    for (std::uint16_t i = 0; i < p->num_operands; ++i)
      if (p->operands[i].type == SPV_OPERAND_TYPE_ID) in.ids.push_back(p->operands[i].offset);
    static_cast<Module*>(user)->instructions.push_back(std::move(in));
    return SPV_SUCCESS;
  };
  const spv_result_t r = spvBinaryParse(context, &m, words.data(), words.size(), nullptr, on_instruction, &diagnostic);
  std::string message = diagnostic && diagnostic->error ? diagnostic->error : "";
  spvDiagnosticDestroy(diagnostic);
  spvContextDestroy(context);
  if (r != SPV_SUCCESS) throw BackendError("SPIR-V to KHR cooperative matrices: the module does not parse: " + message);
  return m;
}

std::vector<std::uint32_t> string_words(const std::string& s) {
  std::vector<std::uint32_t> w(s.size() / 4 + 1, 0);
  std::memcpy(w.data(), s.data(), s.size());
  return w;
}

std::string string_of(const Instruction& in, std::size_t first) {
  const char* p = reinterpret_cast<const char*>(in.words.data() + first);
  return std::string(p, strnlen(p, (in.words.size() - first) * 4));
}

class Rewrite {
 public:
  explicit Rewrite(Module m) : m_(std::move(m)), parent_(m_.header[3]), use_(m_.header[3], -1) {
    std::iota(parent_.begin(), parent_.end(), 0u);
    for (std::size_t i = 0; i < m_.instructions.size(); ++i)
      if (m_.instructions[i].result) def_[m_.instructions[i].result] = i;
    classify_types();
    join_and_anchor();
    plan_variants();
  }

  std::vector<std::uint32_t> emit() {
    std::vector<std::uint32_t> out(m_.header.begin(), m_.header.end());
    auto put = [&](std::uint32_t opcode, const std::vector<std::uint32_t>& operands) {
      out.push_back(static_cast<std::uint32_t>(operands.size() + 1) << 16 | opcode);
      out.insert(out.end(), operands.begin(), operands.end());
    };
    for (const Instruction& in : m_.instructions) {
      const std::uint32_t op = in.opcode();
      std::vector<std::uint32_t> w(in.words.begin() + 1, in.words.end());  // operands
      if (op == spv::OpCapability && w[0] == spv::CapabilityCooperativeMatrixNV) {
        put(spv::OpCapability, {kCapabilityKhr});
      } else if (op == spv::OpExtension && string_of(in, 1) == "SPV_NV_cooperative_matrix") {
        put(spv::OpExtension, string_words("SPV_KHR_cooperative_matrix"));
      } else if (op == spv::OpTypeCooperativeMatrixNV) {
        for (const auto& c : new_constants_) put(spv::OpConstant, c);  // before the first matrix type
        new_constants_.clear();
        for (std::uint32_t u : uses_of(in.result)) put(kOpTypeKhr, {variant(in.result, u), w[1], w[2], w[3], w[4], constant_[u]});
      } else if (holds_matrix(in.result) && (op == spv::OpTypeArray || op == spv::OpTypeRuntimeArray || op == spv::OpTypePointer)) {
        const std::size_t element = op == spv::OpTypePointer ? 2 : 1;
        for (std::uint32_t u : uses_of(in.result)) {
          std::vector<std::uint32_t> v = w;
          v[0] = variant(in.result, u);
          v[element] = variant(w[element], u);
          put(op, v);
        }
      } else {
        if (in.type && holds_matrix(in.type)) w[0] = variant(in.type, use(in.result));
        if (op == spv::OpCooperativeMatrixLoadNV) {  // type result pointer stride column-major [memory]
          std::vector<std::uint32_t> v{w[0], w[1], w[2], layout(w[4]), w[3]};
          v.insert(v.end(), w.begin() + 5, w.end());
          put(kOpLoadKhr, v);
        } else if (op == spv::OpCooperativeMatrixStoreNV) {  // pointer object stride column-major [memory]
          std::vector<std::uint32_t> v{w[0], w[1], layout(w[3]), w[2]};
          v.insert(v.end(), w.begin() + 4, w.end());
          put(kOpStoreKhr, v);
        } else if (op == spv::OpCooperativeMatrixMulAddNV) {
          put(kOpMulAddKhr, w);
        } else if (op == spv::OpCooperativeMatrixLengthNV) {
          const auto uses = uses_of(w[2]);
          if (uses.size() != 1) fail("the length of a fragment type used as " + std::to_string(uses.size()) + " operands");
          w[2] = variant(w[2], *uses.begin());
          put(kOpLengthKhr, w);
        } else {
          put(op, w);
        }
      }
    }
    out[3] = bound_;
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& what) { throw BackendError("SPIR-V to KHR cooperative matrices: " + what); }

  const Instruction& def(std::uint32_t id) const { return m_.instructions[def_.at(id)]; }
  bool holds_matrix(std::uint32_t type) const { return holds_.count(type) != 0; }

  /// Which types hold matrices: the NV matrix types and arrays of and pointers to them.
  void classify_types() {
    for (const Instruction& in : m_.instructions) {
      const std::uint32_t op = in.opcode();
      if (op == spv::OpTypeCooperativeMatrixNV) holds_.insert(in.result);
      if ((op == spv::OpTypeArray || op == spv::OpTypeRuntimeArray) && holds_matrix(in.words[2])) holds_.insert(in.result);
      if (op == spv::OpTypePointer && holds_matrix(in.words[3])) holds_.insert(in.result);
      if (op == spv::OpTypeStruct || op == spv::OpTypeFunction)
        for (std::size_t k = 2; k < in.words.size(); ++k)
          if (holds_matrix(in.words[k])) fail(std::string("a fragment in a ") + (op == spv::OpTypeStruct ? "struct" : "function's signature"));
    }
  }

  std::uint32_t find(std::uint32_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void join(std::uint32_t a, std::uint32_t b) {
    a = find(a), b = find(b);
    if (a != b) parent_[a] = b;
  }
  std::uint32_t type_of(std::uint32_t id) const {
    auto it = def_.find(id);
    return it == def_.end() ? 0 : m_.instructions[it->second].type;
  }

  /// Joins the ids that carry the same fragments (a value, the variable it is stored in, the
  /// access chains into an array of them, phis and selects), then gives each class the use of
  /// the multiply-add operand it feeds; classes that feed none are accumulators.
  void join_and_anchor() {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> anchors;  // id, use
    for (const Instruction& in : m_.instructions) {
      const std::uint32_t op = in.opcode();
      if (op == spv::OpCooperativeMatrixMulAddNV) {
        anchors.insert(anchors.end(), {{in.words[3], 0u}, {in.words[4], 1u}, {in.words[5], kAccumulator}, {in.result, kAccumulator}});
        continue;
      }
      std::vector<std::uint32_t> carried;
      if (in.result && in.type && holds_matrix(in.type)) carried.push_back(in.result);
      for (std::uint16_t at : in.ids)
        if (holds_matrix(type_of(in.words[at]))) carried.push_back(in.words[at]);
      if (carried.empty()) continue;
      if (op == spv::OpFunctionCall || op == spv::OpReturnValue || op == spv::OpFunctionParameter)
        fail("a fragment passed to or returned from a function");
      for (std::size_t k = 1; k < carried.size(); ++k) join(carried[0], carried[k]);
    }
    std::vector<int> use(parent_.size(), -1);
    for (const auto& [id, u] : anchors) {
      int& slot = use[find(id)];
      if (slot >= 0 && slot != static_cast<int>(u))
        fail("fragment %" + std::to_string(id) + " is both a multiply-add's " + kUseNames[static_cast<std::size_t>(slot)] + " and its " +
             kUseNames[u]);
      slot = static_cast<int>(u);
    }
    for (std::uint32_t id = 0; id < parent_.size(); ++id) use_[id] = use[find(id)] < 0 ? static_cast<int>(kAccumulator) : use[find(id)];
  }
  std::uint32_t use(std::uint32_t id) const { return static_cast<std::uint32_t>(use_[id]); }

  /// The uses each matrix-holding type is declared for (those of the ids of that type, and of the
  /// types that hold it; a type nothing uses, once: its element's first use, a matrix type's as
  /// an accumulator), and the ids of those declarations: the first keeps the type's id.
  void plan_variants() {
    bound_ = m_.header[3];
    plan_constants();
    for (const Instruction& in : m_.instructions) {
      if (in.type && holds_matrix(in.type)) uses_[in.type].insert(use(in.result));
      if (in.opcode() == spv::OpCooperativeMatrixLengthNV) uses_[in.words[3]];
    }
    auto element = [](const Instruction& in) { return in.words[in.opcode() == spv::OpTypePointer ? 3 : 2]; };
    for (auto it = m_.instructions.rbegin(); it != m_.instructions.rend(); ++it)
      if (holds_matrix(it->result) && it->opcode() != spv::OpTypeCooperativeMatrixNV) {
        const std::set<std::uint32_t> uses = uses_[it->result];
        uses_[element(*it)].insert(uses.begin(), uses.end());
      }
    for (const Instruction& in : m_.instructions)
      if (holds_matrix(in.result) && uses_[in.result].empty())
        uses_[in.result].insert(in.opcode() == spv::OpTypeCooperativeMatrixNV ? kAccumulator : *uses_[element(in)].begin());
    for (const auto& [type, uses] : uses_) {
      bool first = true;
      for (std::uint32_t u : uses) {
        variants_[{type, u}] = first ? type : bound_++;
        first = false;
      }
    }
  }
  const std::set<std::uint32_t>& uses_of(std::uint32_t type) const { return uses_.at(type); }

  /// The integer constants 0, 1 and 2 (uses and layouts) of the first matrix type's rows' type:
  /// those the module declares before it, the others new (declared before it).
  void plan_constants() {
    std::uint32_t int_type = 0;
    for (const Instruction& in : m_.instructions) {
      if (in.opcode() == spv::OpTypeCooperativeMatrixNV) {
        int_type = def(in.words[4]).type;
        break;
      }
    }
    if (!int_type) return;
    for (const Instruction& in : m_.instructions) {
      if (in.opcode() == spv::OpTypeCooperativeMatrixNV) break;
      if (in.opcode() == spv::OpConstant && in.type == int_type && in.words.size() == 4 && in.words[3] < 3 && !constant_[in.words[3]])
        constant_[in.words[3]] = in.result;
    }
    for (std::uint32_t u = 0; u < 3; ++u)
      if (!constant_[u]) {
        constant_[u] = bound_++;
        new_constants_.push_back({int_type, constant_[u], u});
      }
  }
  std::uint32_t variant(std::uint32_t type, std::uint32_t use) const {
    auto it = variants_.find({type, use});
    if (it == variants_.end()) fail("type %" + std::to_string(type) + " has no declaration for use " + kUseNames[use]);
    return it->second;
  }
  /// NV's column-major boolean as KHR's layout constant.
  std::uint32_t layout(std::uint32_t column_major) const {
    const std::uint32_t op = def(column_major).opcode();
    if (op != spv::OpConstantTrue && op != spv::OpConstantFalse) fail("a fragment load or store whose column-major operand is not a constant");
    return constant_[op == spv::OpConstantTrue ? 1 : 0];
  }

  Module m_;
  std::map<std::uint32_t, std::size_t> def_;  // id -> the instruction that defines it
  std::set<std::uint32_t> holds_;             // types that hold matrices
  std::vector<std::uint32_t> parent_;         // union-find over ids
  std::vector<int> use_;                      // id -> its class's use
  std::map<std::uint32_t, std::set<std::uint32_t>> uses_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> variants_;  // (type, use) -> id
  std::array<std::uint32_t, 3> constant_{};                                    // the integer constants 0, 1, 2
  std::vector<std::vector<std::uint32_t>> new_constants_;                      // OpConstant operands to declare
  std::uint32_t bound_ = 0;
};

}  // namespace

bool uses_nv_cooperative_matrix(const std::vector<std::uint32_t>& words) {
  // Capabilities come first in a module.
  for (std::size_t i = 5; i + 1 < words.size() && (words[i] & 0xffffu) == spv::OpCapability && words[i] >> 16 != 0; i += words[i] >> 16)
    if (words[i + 1] == spv::CapabilityCooperativeMatrixNV) return true;
  return false;
}

std::vector<std::uint32_t> khr_cooperative_matrix(const std::vector<std::uint32_t>& nv) { return Rewrite(parse(nv)).emit(); }

}  // namespace qkv::codegen
