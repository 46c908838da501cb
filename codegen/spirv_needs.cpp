// A SPIR-V module's needs, read word by word (SPIR-V 1.6 grammar; SPV_KHR_cooperative_matrix's
// opcodes, newer than Debian 12's headers, by number). One pass: the logical layout declares
// decorations, types and constants before any use, except the ids of LocalSizeId and the
// members of the push-constant block, which are resolved at the end.
#define SPV_ENABLE_UTILITY_CODE
#include "codegen/spirv_needs.hpp"

#include <spirv/unified1/spirv.hpp>

#include <map>
#include <optional>
#include <tuple>

#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

// SPV_KHR_cooperative_matrix (Debian 12's headers predate it), as in spirv_khr.cpp.
constexpr std::uint32_t kOpTypeCoopKhr = 4456, kOpLoadCoopKhr = 4457, kOpMulAddCoopKhr = 4459;
constexpr std::uint32_t kWorkgroupStorage = spv::StorageClassWorkgroup, kPushConstantStorage = spv::StorageClassPushConstant;

struct Type {
  spv::Op op = spv::OpNop;
  std::vector<std::uint32_t> operands;  // the instruction's words after its result id
};

class Reader {
 public:
  Reader(const std::vector<std::uint32_t>& words, const std::vector<std::uint32_t>& specialization) : words_(words), spec_(specialization) {}

  SpirvNeeds read() {
    if (words_.size() < 5 || words_[0] != spv::MagicNumber) throw BackendError("spirv: not a SPIR-V module (no magic number)");
    needs_.version = words_[1];
    for (std::size_t at = 5; at < words_.size();) {
      const std::uint32_t count = words_[at] >> 16, op = words_[at] & 0xffffu;
      if (count == 0 || at + count > words_.size())
        throw BackendError("spirv: the instruction at word " + std::to_string(at) + " runs past the module's end");
      instruction(static_cast<spv::Op>(op), &words_[at + 1], count - 1);
      at += count;
    }
    finish();
    return std::move(needs_);
  }

 private:
  // w: the instruction's operand words (after the opcode word), n of them.
  void instruction(spv::Op op, const std::uint32_t* w, std::uint32_t n) {
    // Every case below reads at most its first 5 words: shorter instructions are malformed.
    if (n < min_operands(op))
      throw BackendError("spirv: instruction " + std::to_string(op) + " has " + std::to_string(n) + " operand words, fewer than it must");
    bool has_result = false, has_type = false;
    spv::HasResultAndType(op, &has_result, &has_type);
    if (op == kOpLoadCoopKhr || op == kOpMulAddCoopKhr) has_result = has_type = true;
    if (op == kOpTypeCoopKhr) has_result = true;
    if (has_result && has_type && n >= 2) type_of_[w[1]] = w[0];
    switch (static_cast<std::uint32_t>(op)) {  // an opcode word: any number, most of them not ours
      case spv::OpCapability: needs_.capabilities.insert(w[0]); break;
      case spv::OpExtension: needs_.extensions.insert(literal_string(w, n)); break;
      case spv::OpMemoryModel: needs_.memory_model = w[1]; break;
      case spv::OpExecutionMode:
        if (w[1] == spv::ExecutionModeLocalSize && n >= 5) local_size_ = {w[2], w[3], w[4]};
        break;
      case spv::OpExecutionModeId:
        if (w[1] == spv::ExecutionModeLocalSizeId && n >= 5) local_size_ids_ = {w[2], w[3], w[4]};
        break;
      case spv::OpDecorate:
        if (w[1] == spv::DecorationSpecId && n >= 3) spec_id_[w[0]] = w[2];
        if (w[1] == spv::DecorationBuiltIn && n >= 3 && w[2] == spv::BuiltInWorkgroupSize) workgroup_size_id_ = w[0];
        break;
      case spv::OpMemberDecorate:
        if (w[2] == spv::DecorationOffset && n >= 4) member_offset_[{w[0], w[1]}] = w[3];
        break;
      case spv::OpTypeBool:
      case spv::OpTypeInt:
      case spv::OpTypeFloat:
      case spv::OpTypeVector:
      case spv::OpTypeMatrix:
      case spv::OpTypeArray:
      case spv::OpTypeRuntimeArray:
      case spv::OpTypeStruct:
      case spv::OpTypePointer:
      case spv::OpTypeCooperativeMatrixNV: types_[w[0]] = Type{op, {w + 1, w + n}}; break;
      case spv::OpConstant:
      case spv::OpSpecConstant: {
        std::uint64_t v = n >= 3 ? w[2] : 0;
        if (n >= 4) v |= std::uint64_t{w[3]} << 32;
        if (op == spv::OpSpecConstant)
          if (auto id = spec_id_.find(w[1]); id != spec_id_.end() && id->second < spec_.size()) v = spec_[id->second];
        values_[w[1]] = v;
        break;
      }
      case spv::OpConstantTrue:
      case spv::OpConstantFalse:
      case spv::OpSpecConstantTrue:
      case spv::OpSpecConstantFalse: {
        bool v = op == spv::OpConstantTrue || op == spv::OpSpecConstantTrue;
        if (op == spv::OpSpecConstantTrue || op == spv::OpSpecConstantFalse)
          if (auto id = spec_id_.find(w[1]); id != spec_id_.end() && id->second < spec_.size()) v = spec_[id->second] != 0;
        values_[w[1]] = v;
        break;
      }
      case spv::OpConstantComposite:
      case spv::OpSpecConstantComposite: composites_[w[1]] = {w + 2, w + n}; break;
      case spv::OpSpecConstantOp: spec_op(w, n); break;
      case spv::OpVariable:
        if (w[2] == kWorkgroupStorage) shared_.push_back(w[1]);
        if (w[2] == kPushConstantStorage) push_constants_.push_back(w[1]);
        if (w[2] == spv::StorageClassStorageBuffer) ++needs_.storage_buffers;
        break;
      case spv::OpControlBarrier:
        scope(needs_.execution_scopes, w[0], "a control barrier's execution scope");
        scope(needs_.memory_scopes, w[1], "a control barrier's memory scope");
        break;
      case spv::OpMemoryBarrier: scope(needs_.memory_scopes, w[0], "a memory barrier's scope"); break;
      case spv::OpAtomicStore: scope(needs_.memory_scopes, w[1], "an atomic's scope"); break;
      case spv::OpCooperativeMatrixMulAddNV: product(w, false); break;
      default:
        if (op == kOpTypeCoopKhr) types_[w[0]] = Type{op, {w + 1, w + n}};
        else if (op == kOpMulAddCoopKhr) product(w, true);
        else if (is_atomic(op)) scope(needs_.memory_scopes, w[3], "an atomic's scope");
        else if (op >= spv::OpGroupNonUniformElect && op <= spv::OpGroupNonUniformQuadSwap)
          scope(needs_.execution_scopes, w[2], "a group operation's scope");
        break;
    }
  }

  static std::uint32_t min_operands(spv::Op op) {
    switch (static_cast<std::uint32_t>(op)) {  // an opcode word: any number, most of them not ours
      case spv::OpCapability:
      case spv::OpExtension: return 1;
      case spv::OpMemoryModel:
      case spv::OpExecutionMode:
      case spv::OpExecutionModeId:
      case spv::OpDecorate:
      case spv::OpConstant:
      case spv::OpSpecConstant:
      case spv::OpConstantTrue:
      case spv::OpConstantFalse:
      case spv::OpSpecConstantTrue:
      case spv::OpSpecConstantFalse:
      case spv::OpConstantComposite:
      case spv::OpSpecConstantComposite:
      case spv::OpControlBarrier:
      case spv::OpMemoryBarrier: return 2;
      case spv::OpMemberDecorate:
      case spv::OpSpecConstantOp:
      case spv::OpVariable:
      case spv::OpAtomicStore: return 3;
      case spv::OpCooperativeMatrixMulAddNV: return 5;
      default:
        if (op == kOpTypeCoopKhr) return 5;
        if (op == kOpMulAddCoopKhr) return 5;
        if (is_atomic(op)) return 4;
        if (op >= spv::OpGroupNonUniformElect && op <= spv::OpGroupNonUniformQuadSwap) return 3;
        if (op == spv::OpTypeCooperativeMatrixNV) return 5;
        if (op >= spv::OpTypeVoid && op <= spv::OpTypeForwardPointer) return 1;  // types_[w[0]]
        return 0;
    }
  }

  static bool is_atomic(spv::Op op) {
    return (op >= spv::OpAtomicLoad && op <= spv::OpAtomicXor) || op == spv::OpAtomicFMinEXT || op == spv::OpAtomicFMaxEXT ||
           op == spv::OpAtomicFAddEXT;
  }

  static std::string literal_string(const std::uint32_t* w, std::uint32_t n) {
    std::string s;
    for (std::uint32_t i = 0; i < n; ++i)
      for (int b = 0; b < 4; ++b) {
        const char c = static_cast<char>((w[i] >> (8 * b)) & 0xffu);
        if (c == '\0') return s;
        s += c;
      }
    return s;
  }

  std::optional<std::uint64_t> value(std::uint32_t id) const {
    if (auto it = values_.find(id); it != values_.end()) return it->second;
    return std::nullopt;
  }

  void scope(std::set<std::uint32_t>& into, std::uint32_t id, const char* what) {
    if (auto v = value(id)) into.insert(static_cast<std::uint32_t>(*v));
    else needs_.unknown.push_back(std::string(what) + " (id " + std::to_string(id) + ") is no constant");
  }

  // An OpSpecConstantOp: the integer and boolean operations a shader's sizes are written with.
  void spec_op(const std::uint32_t* w, std::uint32_t n) {
    const std::uint32_t id = w[1];
    const auto op = static_cast<spv::Op>(w[2]);
    if (op == spv::OpCompositeExtract) {  // a composite's element at a literal index (the workgroup size's)
      if (n >= 5)
        if (auto v = composite_element(w[3], w[4])) values_[id] = *v;
      return;
    }
    std::vector<std::uint64_t> a;
    for (std::uint32_t i = 3; i < n; ++i) {
      auto v = value(w[i]);
      if (!v) return;  // depends on something unknown: so is this
      a.push_back(*v);
    }
    const auto s = [&](std::size_t i) { return static_cast<std::int64_t>(static_cast<std::int32_t>(a[i])); };
    std::optional<std::uint64_t> r;
    const bool two = a.size() >= 2, three = a.size() >= 3;
    // A table of folds, one a line: laid out by hand.
    // clang-format off
    switch (static_cast<std::uint32_t>(op)) {  // an opcode word: any number, most of them not ours
      case spv::OpIAdd: if (two) r = a[0] + a[1]; break;
      case spv::OpISub: if (two) r = a[0] - a[1]; break;
      case spv::OpIMul: if (two) r = a[0] * a[1]; break;
      case spv::OpUDiv: if (two && a[1]) r = a[0] / a[1]; break;
      case spv::OpSDiv: if (two && a[1]) r = static_cast<std::uint64_t>(s(0) / s(1)); break;
      case spv::OpUMod: if (two && a[1]) r = a[0] % a[1]; break;
      case spv::OpShiftLeftLogical: if (two && a[1] < 32) r = a[0] << a[1]; break;
      case spv::OpShiftRightLogical: if (two && a[1] < 32) r = a[0] >> a[1]; break;
      case spv::OpBitwiseAnd: if (two) r = a[0] & a[1]; break;
      case spv::OpBitwiseOr: if (two) r = a[0] | a[1]; break;
      case spv::OpBitwiseXor: if (two) r = a[0] ^ a[1]; break;
      case spv::OpIEqual:
      case spv::OpLogicalEqual: if (two) r = a[0] == a[1]; break;
      case spv::OpINotEqual:
      case spv::OpLogicalNotEqual: if (two) r = a[0] != a[1]; break;
      case spv::OpULessThan: if (two) r = a[0] < a[1]; break;
      case spv::OpULessThanEqual: if (two) r = a[0] <= a[1]; break;
      case spv::OpUGreaterThan: if (two) r = a[0] > a[1]; break;
      case spv::OpUGreaterThanEqual: if (two) r = a[0] >= a[1]; break;
      case spv::OpSLessThan: if (two) r = s(0) < s(1); break;
      case spv::OpSLessThanEqual: if (two) r = s(0) <= s(1); break;
      case spv::OpSGreaterThan: if (two) r = s(0) > s(1); break;
      case spv::OpSGreaterThanEqual: if (two) r = s(0) >= s(1); break;
      case spv::OpLogicalAnd: if (two) r = a[0] && a[1]; break;
      case spv::OpLogicalOr: if (two) r = a[0] || a[1]; break;
      case spv::OpLogicalNot: if (!a.empty()) r = !a[0]; break;
      case spv::OpSelect: if (three) r = a[0] ? a[1] : a[2]; break;
      case spv::OpUConvert:
      case spv::OpSConvert:
      case spv::OpBitcast: if (!a.empty()) r = a[0]; break;
      default: break;
    }
    // clang-format on
    if (r) values_[id] = *r & 0xffffffffu;  // sizes and scopes are 32-bit: wrap as the device would
  }

  std::optional<std::uint64_t> composite_element(std::uint32_t composite, std::uint32_t index) const {
    auto it = composites_.find(composite);
    if (it == composites_.end() || index >= it->second.size()) return std::nullopt;
    return value(it->second[index]);
  }

  // m x n and component type of a cooperative-matrix type, NV's or KHR's.
  struct Fragment {
    std::uint32_t rows = 0, columns = 0, component = 0, scope = 0;
  };
  std::optional<Fragment> fragment(std::uint32_t value_id) {
    auto t = type_of_.find(value_id);
    if (t == type_of_.end()) return std::nullopt;
    auto ty = types_.find(t->second);
    if (ty == types_.end() || ty->second.operands.size() < 4) return std::nullopt;
    const auto& o = ty->second.operands;
    auto scope = value(o[1]), rows = value(o[2]), columns = value(o[3]);
    auto component = component_type(o[0]);
    if (!scope || !rows || !columns || !component) return std::nullopt;
    return Fragment{static_cast<std::uint32_t>(*rows), static_cast<std::uint32_t>(*columns), *component, static_cast<std::uint32_t>(*scope)};
  }

  std::optional<std::uint32_t> component_type(std::uint32_t type) const {
    auto it = types_.find(type);
    if (it == types_.end() || it->second.operands.empty()) return std::nullopt;
    const std::uint32_t width = it->second.operands[0];
    if (it->second.op == spv::OpTypeFloat) {
      if (width == 16) return 0u;
      if (width == 32) return 1u;
      if (width == 64) return 2u;
    }
    if (it->second.op == spv::OpTypeInt && it->second.operands.size() >= 2) {
      const bool is_signed = it->second.operands[1] != 0;
      const std::uint32_t base = is_signed ? 3 : 7;
      if (width == 8) return base;
      if (width == 16) return base + 1;
      if (width == 32) return base + 2;
      if (width == 64) return base + 3;
    }
    return std::nullopt;
  }

  // OpCooperativeMatrixMulAdd{NV,KHR}: result type, result, A, B, C.
  void product(const std::uint32_t* w, bool khr) {
    auto a = fragment(w[2]), b = fragment(w[3]), c = fragment(w[4]);
    type_of_[w[1]] = w[0];
    auto result = fragment(w[1]);
    if (!a || !b || !c || !result) {
      needs_.unknown.push_back("a cooperative-matrix multiply-add whose fragment types are not constant");
      return;
    }
    SpirvNeeds::Product p{a->rows, b->columns, a->columns, a->component, b->component, c->component, result->component, result->scope, khr};
    needs_.products.insert(p);
  }

  // Bytes a value of `type` takes at its natural size (no padding between struct members).
  std::optional<std::uint64_t> size_of(std::uint32_t type, int depth = 0) const {
    auto it = types_.find(type);
    if (it == types_.end() || depth > 16) return std::nullopt;
    const auto& o = it->second.operands;
    switch (static_cast<std::uint32_t>(it->second.op)) {  // an opcode word
      case spv::OpTypeBool: return 4;
      case spv::OpTypeInt:
      case spv::OpTypeFloat: return o[0] / 8;
      case spv::OpTypeVector:
      case spv::OpTypeMatrix: {
        auto e = size_of(o[0], depth + 1);
        if (!e) return std::nullopt;
        return *e * o[1];
      }
      case spv::OpTypeArray: {
        auto e = size_of(o[0], depth + 1);
        auto length = value(o[1]);
        if (!e || !length) return std::nullopt;
        return *e * *length;
      }
      case spv::OpTypeStruct: {
        std::uint64_t total = 0;
        for (std::uint32_t m : o) {
          auto e = size_of(m, depth + 1);
          if (!e) return std::nullopt;
          total += *e;
        }
        return total;
      }
      default: return std::nullopt;
    }
  }

  // The type a pointer-typed variable points to.
  std::optional<std::uint32_t> pointee(std::uint32_t variable) const {
    auto t = type_of_.find(variable);
    if (t == type_of_.end()) return std::nullopt;
    auto p = types_.find(t->second);
    if (p == types_.end() || p->second.op != spv::OpTypePointer || p->second.operands.size() < 2) return std::nullopt;
    return p->second.operands[1];
  }

  void finish() {
    // Workgroup size: the WorkgroupSize built-in (specializable) over LocalSizeId over LocalSize.
    std::optional<std::array<std::uint32_t, 3>> size = local_size_;
    if (local_size_ids_) {
      std::array<std::uint32_t, 3> s{};
      bool known = true;
      for (int i = 0; i < 3; ++i) {
        auto v = value((*local_size_ids_)[i]);
        known &= v.has_value();
        s[i] = v ? static_cast<std::uint32_t>(*v) : 0;
      }
      if (known) size = s;
      else needs_.unknown.push_back("the workgroup size (LocalSizeId)");
    }
    if (workgroup_size_id_) {
      std::array<std::uint32_t, 3> s{};
      bool known = true;
      for (std::uint32_t i = 0; i < 3; ++i) {
        auto v = composite_element(*workgroup_size_id_, i);
        known &= v.has_value();
        s[i] = v ? static_cast<std::uint32_t>(*v) : 0;
      }
      if (known) size = s;
      else needs_.unknown.push_back("the workgroup size (the WorkgroupSize built-in)");
    }
    if (size) needs_.workgroup_size = *size;
    for (std::uint32_t v : shared_) {
      auto t = pointee(v);
      auto bytes = t ? size_of(*t) : std::nullopt;
      if (bytes) needs_.shared_bytes += *bytes, needs_.shared_variables.push_back(*bytes);
      else needs_.unknown.push_back("the size of shared variable %" + std::to_string(v));
    }
    for (std::uint32_t v : push_constants_) {
      auto t = pointee(v);
      auto block = t ? types_.find(*t) : types_.end();
      if (block == types_.end() || block->second.op != spv::OpTypeStruct) {
        needs_.unknown.push_back("the push-constant block %" + std::to_string(v));
        continue;
      }
      const auto& members = block->second.operands;
      for (std::uint32_t m = 0; m < members.size(); ++m) {
        auto offset = member_offset_.find({*t, m});
        auto bytes = size_of(members[m]);
        if (offset == member_offset_.end() || !bytes) {
          needs_.unknown.push_back("member " + std::to_string(m) + " of the push-constant block");
          continue;
        }
        needs_.push_constant_bytes = std::max<std::uint32_t>(needs_.push_constant_bytes, offset->second + static_cast<std::uint32_t>(*bytes));
      }
    }
  }

  const std::vector<std::uint32_t>& words_;
  const std::vector<std::uint32_t>& spec_;
  SpirvNeeds needs_;
  std::map<std::uint32_t, std::uint32_t> spec_id_, type_of_;
  std::map<std::uint32_t, Type> types_;
  std::map<std::uint32_t, std::uint64_t> values_;
  std::map<std::uint32_t, std::vector<std::uint32_t>> composites_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> member_offset_;
  std::vector<std::uint32_t> shared_, push_constants_;
  std::optional<std::array<std::uint32_t, 3>> local_size_, local_size_ids_;
  std::optional<std::uint32_t> workgroup_size_id_;
};

}  // namespace

bool SpirvNeeds::Product::operator<(const Product& o) const {
  return std::tie(m, n, k, a, b, c, result, scope, khr) < std::tie(o.m, o.n, o.k, o.a, o.b, o.c, o.result, o.scope, o.khr);
}

SpirvNeeds spirv_needs(const std::vector<std::uint32_t>& words, const std::vector<std::uint32_t>& specialization) {
  return Reader(words, specialization).read();
}

std::string capability_name(std::uint32_t capability) {
  switch (capability) {
    case spv::CapabilityMatrix: return "Matrix";
    case spv::CapabilityShader: return "Shader";
    case spv::CapabilityFloat16: return "Float16";
    case spv::CapabilityFloat64: return "Float64";
    case spv::CapabilityInt64: return "Int64";
    case spv::CapabilityInt64Atomics: return "Int64Atomics";
    case spv::CapabilityInt16: return "Int16";
    case spv::CapabilityInt8: return "Int8";
    case spv::CapabilityGroupNonUniform: return "GroupNonUniform";
    case spv::CapabilityGroupNonUniformVote: return "GroupNonUniformVote";
    case spv::CapabilityGroupNonUniformArithmetic: return "GroupNonUniformArithmetic";
    case spv::CapabilityGroupNonUniformBallot: return "GroupNonUniformBallot";
    case spv::CapabilityGroupNonUniformShuffle: return "GroupNonUniformShuffle";
    case spv::CapabilityGroupNonUniformShuffleRelative: return "GroupNonUniformShuffleRelative";
    case spv::CapabilityGroupNonUniformClustered: return "GroupNonUniformClustered";
    case spv::CapabilityGroupNonUniformQuad: return "GroupNonUniformQuad";
    case spv::CapabilityStorageBuffer16BitAccess: return "StorageBuffer16BitAccess";
    case spv::CapabilityUniformAndStorageBuffer16BitAccess: return "UniformAndStorageBuffer16BitAccess";
    case spv::CapabilityStoragePushConstant16: return "StoragePushConstant16";
    case spv::CapabilityStorageBuffer8BitAccess: return "StorageBuffer8BitAccess";
    case spv::CapabilityVulkanMemoryModel: return "VulkanMemoryModel";
    case spv::CapabilityVulkanMemoryModelDeviceScope: return "VulkanMemoryModelDeviceScope";
    case spv::CapabilityCooperativeMatrixNV: return "CooperativeMatrixNV";
    case 6022: return "CooperativeMatrixKHR";
    case spv::CapabilityAtomicFloat32AddEXT: return "AtomicFloat32AddEXT";
    default: return "capability " + std::to_string(capability);
  }
}

std::string scope_name(std::uint32_t scope) {
  switch (scope) {
    case spv::ScopeCrossDevice: return "CrossDevice";
    case spv::ScopeDevice: return "Device";
    case spv::ScopeWorkgroup: return "Workgroup";
    case spv::ScopeSubgroup: return "Subgroup";
    case spv::ScopeInvocation: return "Invocation";
    case spv::ScopeQueueFamily: return "QueueFamily";
    default: return "scope " + std::to_string(scope);
  }
}

std::string component_name(std::uint32_t component) {
  static const char* names[] = {"f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"};
  return component < std::size(names) ? names[component] : "component " + std::to_string(component);
}

}  // namespace qkv::codegen
