// A kernel family's push constants, declared once by name: the GLSL block its shader reads
// (`pc.queries`, `pc.scale`, `pc.batch[d]`) and the words its launch packs are both generated from
// the one declaration, so a shader and its launch cannot disagree on an order or a type. A
// launch packs by name; a member left unset, set twice, set with another type or not declared is
// our bug, reported at once. Source and launch carry the declaration's signature
// (KernelSource::push_signature, KernelLaunch::push_signature), which the backend compares
// before it records a dispatch.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/glsl.hpp"

namespace qkv::codegen {

class PushConstants {
 public:
  enum class Type : std::uint8_t { u32, i32, f32 };
  struct Member {
    std::string name;
    Type type = Type::u32;
    bool array = false;  // an array of `count` uints (declared with at least one element)
    int count = 1;
    std::string doc;
  };

  /// A uint, int or float member.
  PushConstants& scalar(std::string name, Type type, std::string doc);
  /// An array of `count` uints (per batch dim, say); declared with one element when count is 0,
  /// so that loops over no dims still compile, and packed as declared.
  PushConstants& array(std::string name, int count, std::string doc);

  /// Appends `more`'s members after these (a family's words, then a fused kernel's own).
  PushConstants& extend(const PushConstants& more);

  const std::vector<Member>& members() const { return members_; }
  /// 32-bit words the block takes (std430: every member 4 bytes, arrays 4 bytes an element).
  int words() const;
  /// `layout(push_constant) uniform Params { ... } pc;`, one member a line with its doc.
  std::string glsl() const;
  /// A hash of the members' names, types and counts in order.
  std::uint64_t signature() const;

  /// Values for a launch, set by name in any order; words() lays them out as declared.
  class Values {
   public:
    explicit Values(const PushConstants& declaration);
    Values& set(std::string_view name, std::uint32_t value);
    Values& set_int(std::string_view name, std::int64_t value);
    Values& set_float(std::string_view name, double value);
    Values& set_array(std::string_view name, std::span<const std::int64_t> values);
    /// The words in declaration order. QKV_ASSERT: every member was set.
    std::vector<std::uint32_t> words() const;

   private:
    std::size_t find(std::string_view name, Type type, bool array) const;
    const PushConstants* declaration_;
    std::vector<std::vector<std::uint32_t>> values_;
    std::vector<bool> set_;
  };
  /// Values refer to this declaration: keep it alive while they are set (no temporaries).
  Values values() const& { return Values(*this); }
  Values values() const&& = delete;

 private:
  std::vector<Member> members_;
};

/// A kernel family's specialization constants, declared once by name: the shader's
/// `layout(constant_id = i) const uint NAME = default;` lines (ids in declaration order; one may
/// be the workgroup's size, `layout(local_size_x_id = i) in;`) and the launch's values (by name,
/// laid out by id: KernelLaunch::specialization) are both generated from it.
class SpecConstants {
 public:
  struct Member {
    std::string name;  // empty for the workgroup's size
    std::uint32_t fallback = 0;
    std::string doc;
  };
  /// A uint constant with its default (what the shader compiles to before it is specialized).
  SpecConstants& constant(std::string name, std::uint32_t fallback, std::string doc);
  /// The workgroup's invocations along x (gl_WorkGroupSize.x), set by name as `local_size`.
  SpecConstants& local_size(std::string doc);

  const std::vector<Member>& members() const { return members_; }
  /// The declarations, one a line with its doc.
  std::string glsl() const;
  /// A hash of the members' names and ids.
  std::uint64_t signature() const;
  /// A launch's specialization words by the names they were set by ("local_size" for the
  /// workgroup's size). QKV_ASSERT: the launch was specialized from this declaration.
  std::map<std::string, std::uint32_t> named(const KernelLaunch& launch) const;

  /// Values for a launch, set by name; words() gives them by id. QKV_ASSERT: every one set.
  class Values {
   public:
    explicit Values(const SpecConstants& declaration);
    Values& set(std::string_view name, std::uint32_t value);
    std::vector<std::uint32_t> words() const;

   private:
    const SpecConstants* declaration_;
    std::vector<std::uint32_t> values_;
    std::vector<bool> set_;
  };
  Values values() const& { return Values(*this); }
  Values values() const&& = delete;

 private:
  std::vector<Member> members_;
};

/// QKV_ASSERT that `launch` was packed from the push constants `kernel` declares (their
/// signatures agree) and fits them, and that its specialization constants are the ones the
/// kernel declares: what a backend checks before it records a dispatch.
void check_push(const KernelSource& kernel, const KernelLaunch& launch);

}  // namespace qkv::codegen
