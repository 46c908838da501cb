// Models as reflected structs, as PyTorch's nn.Module: a module is a struct whose members are
// submodules, lists of them (std::vector) and parameters, declared with BOOST_HANA_DEFINE_STRUCT
// so that one generic visitor walks any architecture. The members' names are the checkpoint's
// names: walking Gpt2LMHeadModel gives "transformer.h.0.attn.c_attn.weight", as
// model.named_parameters() does in PyTorch. Configs (config.json) are reflected the same way and
// read field by field.
#pragma once

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ir/dtype.hpp"

namespace qkv::models {

/// What a model's forward graph outputs besides its result: the final hidden states ("hidden"),
/// and each layer's attention weights, "weights.<layer>" [B, heads, T, T] (transformers'
/// output_attentions; what `qkv viz` draws).
struct GraphOutputs {
  bool hidden = false;
  bool attention_weights = false;
};

/// One parameter of a module: its checkpoint name (set by name_parameters) and its shape, which
/// the architecture's constructor takes from the config.
struct Parameter {
  std::string name;
  std::vector<std::int64_t> shape;
};

namespace detail {
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};

inline std::string join(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }
}  // namespace detail

namespace detail {
/// The walk behind for_each_parameter, instantiated once per module type (and constness), not
/// once per visitor: the visitor is type-erased, and a model's parameters are few.
template <class Module, class P>
void walk_parameters(Module& module, const std::string& prefix, const std::function<void(const std::string&, P&)>& f) {
  using M = std::remove_const_t<Module>;
  if constexpr (std::is_same_v<M, Parameter>) {
    f(prefix, module);
  } else if constexpr (is_vector<M>::value) {
    for (std::size_t i = 0; i < module.size(); ++i) walk_parameters(module[i], join(prefix, std::to_string(i)), f);
  } else if constexpr (is_optional<M>::value) {
    if (module) walk_parameters(*module, prefix, f);
  } else {
    static_assert(boost::hana::Struct<M>::value,
                  "qkv: a module member is a Parameter, a std::vector or std::optional of modules, or a module (BOOST_HANA_DEFINE_STRUCT)");
    boost::hana::for_each(boost::hana::accessors<M>(), [&](auto member) {
      walk_parameters(boost::hana::second(member)(module), join(prefix, boost::hana::to<const char*>(boost::hana::first(member))), f);
    });
  }
}
}  // namespace detail

/// Calls f(path, parameter) for every parameter of `module` in declaration order, the path the
/// dotted checkpoint name under `prefix` (a list's elements by index, an empty optional module
/// skipped). `Module` is a Parameter, a std::vector or std::optional of modules, or a Hana struct;
/// f takes a `const Parameter&` where the module is const.
template <class Module, class F> void for_each_parameter(Module& module, const std::string& prefix, F&& f) {
  using P = std::conditional_t<std::is_const_v<Module>, const Parameter, Parameter>;
  detail::walk_parameters(module, prefix, std::function<void(const std::string&, P&)>(std::forward<F>(f)));
}

/// Sets every parameter's name to its path: after it, each Parameter knows its checkpoint name.
template <class Module> void name_parameters(Module& module, const std::string& prefix = "") {
  for_each_parameter(module, prefix, [](const std::string& path, Parameter& p) { p.name = path; });
}

/// (name, shape) of every parameter, in declaration order: PyTorch's named_parameters().
template <class Module> std::vector<std::pair<std::string, std::vector<std::int64_t>>> named_parameters(const Module& module) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> all;
  for_each_parameter(module, "", [&](const std::string& path, const Parameter& p) { all.emplace_back(path, p.shape); });
  return all;
}

}  // namespace qkv::models
