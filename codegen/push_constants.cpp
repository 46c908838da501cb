#include "codegen/push_constants.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "codegen/spirv.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

const char* type_name(PushConstants::Type t) {
  switch (t) {
    case PushConstants::Type::u32: return "uint";
    case PushConstants::Type::i32: return "int";
    case PushConstants::Type::f32: return "float";
  }
  return "uint";
}

std::uint32_t word_of(std::int64_t v, std::string_view name) {
  QKV_ASSERT(v >= 0 && v <= std::numeric_limits<std::uint32_t>::max(),
             "push constant " + std::string(name) + ": " + std::to_string(v) + " does not fit a uint");
  return static_cast<std::uint32_t>(v);
}

}  // namespace

PushConstants& PushConstants::scalar(std::string name, Type type, std::string doc) {
  QKV_ASSERT(std::none_of(members_.begin(), members_.end(), [&](const Member& m) { return m.name == name; }),
             "push constant " + name + " declared twice");
  members_.push_back({std::move(name), type, false, 1, std::move(doc)});
  return *this;
}

PushConstants& PushConstants::array(std::string name, int count, std::string doc) {
  QKV_ASSERT(count >= 0, "push constant array " + name + " of negative size");
  QKV_ASSERT(std::none_of(members_.begin(), members_.end(), [&](const Member& m) { return m.name == name; }),
             "push constant " + name + " declared twice");
  members_.push_back({std::move(name), Type::u32, true, count, std::move(doc)});
  return *this;
}

PushConstants& PushConstants::extend(const PushConstants& more) {
  for (const Member& m : more.members_) {
    QKV_ASSERT(std::none_of(members_.begin(), members_.end(), [&](const Member& o) { return o.name == m.name; }),
               "push constant " + m.name + " declared twice");
    members_.push_back(m);
  }
  return *this;
}

int PushConstants::words() const {
  int n = 0;
  for (const Member& m : members_) n += m.array ? std::max(m.count, 1) : 1;
  return n;
}

std::string PushConstants::glsl() const {
  std::string s = "layout(push_constant) uniform Params {\n";
  for (const Member& m : members_)
    s += "  " + std::string(type_name(m.type)) + " " + m.name + (m.array ? "[" + std::to_string(std::max(m.count, 1)) + "]" : "") + ";" +
         (m.doc.empty() ? "" : "  // " + m.doc) + "\n";
  return s + "} pc;\n";
}

std::uint64_t PushConstants::signature() const {
  std::string text;
  for (const Member& m : members_) text += m.name + ":" + type_name(m.type) + (m.array ? "[" + std::to_string(m.count) + "]" : "") + ";";
  return content_hash(text);
}

PushConstants::Values::Values(const PushConstants& declaration)
    : declaration_(&declaration), values_(declaration.members_.size()), set_(declaration.members_.size(), false) {}

std::size_t PushConstants::Values::find(std::string_view name, Type type, bool array) const {
  const auto& members = declaration_->members_;
  const auto it = std::find_if(members.begin(), members.end(), [&](const Member& m) { return m.name == name; });
  QKV_ASSERT(it != members.end(), "push constant " + std::string(name) + " is not declared");
  QKV_ASSERT(it->type == type, "push constant " + std::string(name) + " is declared " + type_name(it->type) + ", set as " + type_name(type));
  QKV_ASSERT(it->array == array, "push constant " + std::string(name) + (it->array ? " is an array" : " is not an array"));
  const auto i = static_cast<std::size_t>(it - members.begin());
  QKV_ASSERT(!set_[i], "push constant " + std::string(name) + " set twice");
  return i;
}

PushConstants::Values& PushConstants::Values::set(std::string_view name, std::uint32_t value) {
  const std::size_t i = find(name, Type::u32, false);
  values_[i] = {value};
  set_[i] = true;
  return *this;
}

PushConstants::Values& PushConstants::Values::set_int(std::string_view name, std::int64_t value) {
  const std::size_t i = find(name, Type::i32, false);
  QKV_ASSERT(value >= std::numeric_limits<std::int32_t>::min() && value <= std::numeric_limits<std::int32_t>::max(),
             "push constant " + std::string(name) + ": " + std::to_string(value) + " does not fit an int");
  values_[i] = {static_cast<std::uint32_t>(static_cast<std::int32_t>(value))};
  set_[i] = true;
  return *this;
}

PushConstants::Values& PushConstants::Values::set_float(std::string_view name, double value) {
  const std::size_t i = find(name, Type::f32, false);
  values_[i] = {std::bit_cast<std::uint32_t>(static_cast<float>(value))};
  set_[i] = true;
  return *this;
}

PushConstants::Values& PushConstants::Values::set_array(std::string_view name, std::span<const std::int64_t> values) {
  const std::size_t i = find(name, Type::u32, true);
  const int count = declaration_->members_[i].count;
  QKV_ASSERT(static_cast<int>(values.size()) == count,
             "push constant " + std::string(name) + ": " + std::to_string(values.size()) + " values for " + std::to_string(count));
  values_[i].clear();
  for (std::int64_t v : values) values_[i].push_back(word_of(v, name));
  set_[i] = true;
  return *this;
}

std::vector<std::uint32_t> PushConstants::Values::words() const {
  std::vector<std::uint32_t> out;
  const auto& members = declaration_->members_;
  for (std::size_t i = 0; i < members.size(); ++i) {
    QKV_ASSERT(set_[i], "push constant " + members[i].name + " was not set");
    out.insert(out.end(), values_[i].begin(), values_[i].end());
    if (values_[i].empty()) out.push_back(0);  // an array of no elements, declared with one
  }
  return out;
}

SpecConstants& SpecConstants::constant(std::string name, std::uint32_t fallback, std::string doc) {
  QKV_ASSERT(!name.empty() && name != "local_size", "specialization constant " + name + ": a reserved name");
  QKV_ASSERT(std::none_of(members_.begin(), members_.end(), [&](const Member& m) { return m.name == name; }),
             "specialization constant " + name + " declared twice");
  members_.push_back({std::move(name), fallback, std::move(doc)});
  return *this;
}

SpecConstants& SpecConstants::local_size(std::string doc) {
  QKV_ASSERT(std::none_of(members_.begin(), members_.end(), [](const Member& m) { return m.name.empty(); }), "the workgroup size declared twice");
  members_.push_back({"", 0, std::move(doc)});
  return *this;
}

std::string SpecConstants::glsl() const {
  std::string s;
  for (std::size_t i = 0; i < members_.size(); ++i) {
    const Member& m = members_[i];
    s += m.name.empty() ? "layout(local_size_x_id = " + std::to_string(i) + ") in;"
                        : "layout(constant_id = " + std::to_string(i) + ") const uint " + m.name + " = " + std::to_string(m.fallback) + "u;";
    s += (m.doc.empty() ? "" : "  // " + m.doc) + "\n";
  }
  return s;
}

std::uint64_t SpecConstants::signature() const {
  std::string text = "specialization:";
  for (const Member& m : members_) text += (m.name.empty() ? "local_size" : m.name) + ";";
  return content_hash(text);
}

std::map<std::string, std::uint32_t> SpecConstants::named(const KernelLaunch& launch) const {
  const std::vector<std::uint32_t>& words = launch.specialization;
  QKV_ASSERT(launch.spec_signature == signature() && words.size() == members_.size(), "a launch specialized from another declaration");
  std::map<std::string, std::uint32_t> out;
  for (std::size_t i = 0; i < words.size(); ++i) out[members_[i].name.empty() ? "local_size" : members_[i].name] = words[i];
  return out;
}

SpecConstants::Values::Values(const SpecConstants& declaration)
    : declaration_(&declaration), values_(declaration.members_.size(), 0), set_(declaration.members_.size(), false) {}

SpecConstants::Values& SpecConstants::Values::set(std::string_view name, std::uint32_t value) {
  const auto& members = declaration_->members_;
  const auto it = std::find_if(members.begin(), members.end(), [&](const Member& m) { return (m.name.empty() ? "local_size" : m.name) == name; });
  QKV_ASSERT(it != members.end(), "specialization constant " + std::string(name) + " is not declared");
  const auto i = static_cast<std::size_t>(it - members.begin());
  QKV_ASSERT(!set_[i], "specialization constant " + std::string(name) + " set twice");
  values_[i] = value;
  set_[i] = true;
  return *this;
}

std::vector<std::uint32_t> SpecConstants::Values::words() const {
  for (std::size_t i = 0; i < set_.size(); ++i)
    QKV_ASSERT(set_[i], "specialization constant " + (declaration_->members_[i].name.empty() ? "local_size" : declaration_->members_[i].name) +
                            " was not set");
  return values_;
}

void check_push(const KernelSource& kernel, const KernelLaunch& launch) {
  QKV_ASSERT(kernel.push_signature != 0, "kernel " + kernel.name + " declares no push constants by name");
  QKV_ASSERT(launch.push_signature == kernel.push_signature,
             "kernel " + kernel.name + ": its launch packed push constants declared differently from the shader's");
  QKV_ASSERT(static_cast<int>(launch.push.size()) <= kMaxPushWords, "kernel " + kernel.name + ": more push-constant words than the pipeline has");
  QKV_ASSERT(launch.specialization.empty() || kernel.spec_signature != 0,
             "kernel " + kernel.name + " declares no specialization constants by name, yet its launch sets some");
  QKV_ASSERT(launch.spec_signature == kernel.spec_signature,
             "kernel " + kernel.name + ": its launch set specialization constants declared differently from the shader's");
}

}  // namespace qkv::codegen
