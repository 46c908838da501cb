// qkv::Tensor: a dense, row-major host tensor that owns its bytes, or reads bytes someone else
// owns (a memory-mapped checkpoint) until it is first written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ir/dtype.hpp"
#include "ir/error.hpp"
#include "ir/half.hpp"

namespace qkv {

namespace tensor_storage {
/// Asks the kernel to back [p, p + bytes) with huge pages where it may (Linux's transparent huge
/// pages, before the first touch): a large tensor read in runs scattered over it (a paged cache)
/// then needs a TLB entry per 2 MiB instead of per 4 KiB. Does nothing for small ones.
void advise_huge_pages(void* p, std::size_t bytes) noexcept;
/// std::allocator whose value-less construct leaves the element as it is (default-initialised):
/// a vector of bytes sized by it is not zeroed, for storage its owner writes in full.
template <class T> struct DefaultInitAllocator : std::allocator<T> {
  using std::allocator<T>::allocator;
  template <class U> struct rebind { using other = DefaultInitAllocator<U>; };
  T* allocate(std::size_t n) {
    T* p = std::allocator<T>::allocate(n);
    advise_huge_pages(p, n * sizeof(T));
    return p;
  }
  template <class U> void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) { ::new (static_cast<void*>(p)) U; }
  template <class U, class... Args> void construct(U* p, Args&&... args) { ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...); }
};
}  // namespace tensor_storage

/// A host tensor: a dtype, a shape and its elements, row-major. Copies are deep, except that a
/// view's bytes are shared until one copy is written to. What graphs take and give on every backend.
class Tensor {
 public:
  Tensor() = default;
  /// A deep copy (a view's bytes shared), its bytes copied at once: the vector's own copy
  /// constructs them one by one through the allocator, a loop over every byte.
  Tensor(const Tensor& other);
  /// As the copy constructor.
  Tensor& operator=(const Tensor& other);
  /// Takes other's bytes (or view); other is left empty, a view of nothing.
  Tensor(Tensor&& other) noexcept;
  /// As the move constructor.
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;
  /// A zero-filled tensor. Throws ShapeError for a negative dim or a size that overflows, and
  /// ResourceError (naming the type and bytes) when the memory cannot be had.
  Tensor(DType dtype, std::vector<std::int64_t> shape);
  /// A tensor whose elements are not set (not zeroed): for a caller that writes every one, such
  /// as a backend copying out a result (zeroing a 4 MiB output before copying it cost a tenth of
  /// a causal attention's run on the cpu). Throws as the constructor does.
  static Tensor uninitialized(DType dtype, std::vector<std::int64_t> shape);
  /// Elements of `shape`, or nullopt when a dim is negative or the count of elements or of
  /// `elem_size`-byte bytes overflows 63 bits: check sizes read from files with this before
  /// allocating anything.
  static std::optional<std::int64_t> checked_numel(const std::vector<std::int64_t>& shape, std::size_t elem_size = 1);
  /// A tensor that reads `nbytes` at `data`, kept alive by `owner` (a mapped file), without
  /// copying them: copies of it share them, and the first mutable access (data<T>() or raw() of
  /// a non-const tensor) copies them into storage of its own. `data` must be aligned to the
  /// dtype's size; throws ShapeError when nbytes does not fit the shape.
  static Tensor view(DType dtype, std::vector<std::int64_t> shape, const std::byte* data, std::size_t nbytes, std::shared_ptr<const void> owner);
  /// A tensor holding `values` (its dtype from the element type, dtype_of; bool stored as
  /// bytes). Throws ShapeError when their count is not the shape's.
  template <class T> static Tensor from(std::vector<std::int64_t> shape, const std::vector<T>& values) {
    Tensor t(dtype_of<T>(), std::move(shape));
    if (static_cast<std::size_t>(t.numel()) != values.size())
      throw ShapeError("tensor: " + std::to_string(values.size()) + " values for shape " + t.type_string());
    if constexpr (std::is_same_v<T, bool>) {
      for (std::size_t i = 0; i < values.size(); ++i) t.bytes_[i] = static_cast<std::byte>(values[i] ? 1 : 0);
    } else {
      if (t.nbytes()) std::memcpy(t.bytes_.data(), values.data(), t.nbytes());
    }
    return t;
  }

  DType dtype() const { return dtype_; }  ///< the element type
  /// The dims, outermost first (empty for a scalar).
  const std::vector<std::int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }  ///< the number of dims
  std::int64_t numel() const;                                   ///< the number of elements (1 for a scalar)
  /// The bytes the elements take.
  std::size_t nbytes() const { return view_ ? view_bytes_ : bytes_.size(); }
  /// Whether this is a default-constructed tensor (no dims and no bytes), not a scalar.
  bool empty() const { return shape_.empty() && nbytes() == 0; }
  /// Whether the bytes are someone else's (view), not yet copied.
  bool is_view() const { return view_ != nullptr; }

  /// Typed element access; T must match the dtype (float, double, std::int32_t, Half, BFloat16,
  /// or std::uint8_t for bool).
  template <class T> T* data() {
    check_type<T>();
    return reinterpret_cast<T*>(raw());
  }
  /// Typed read-only element access; T as for the mutable data<T>() (throws on a mismatch).
  template <class T> const T* data() const {
    check_type<T>();
    return reinterpret_cast<const T*>(raw());
  }
  /// The bytes, to write: a view first copies them into storage of its own.
  std::byte* raw() {
    if (view_) own();
    return bytes_.data();
  }
  /// The bytes, read-only (a view's are the owner's).
  const std::byte* raw() const { return view_ ? view_ : bytes_.data(); }

  /// Element i (row-major) as a double, whatever the dtype.
  double at(std::int64_t i) const;
  /// A copy converted to `dtype` (bool: nonzero is true; f16, bf16: rounded to nearest even).
  Tensor to(DType dtype) const;
  /// The same elements under another shape of equal element count.
  Tensor reshaped(std::vector<std::int64_t> shape) const;
  /// "f32[2,3]".
  std::string type_string() const;

  /// The dtype of element type T (float f32, double f64, std::int32_t i32, Half f16, BFloat16
  /// bf16, bool and std::uint8_t bool); any other T does not compile.
  template <class T> static constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::f32;
    else if constexpr (std::is_same_v<T, double>) return DType::f64;
    else if constexpr (std::is_same_v<T, std::int32_t>) return DType::i32;
    else if constexpr (std::is_same_v<T, Half>) return DType::f16;
    else if constexpr (std::is_same_v<T, BFloat16>) return DType::bf16;
    else {
      static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::uint8_t>, "tensor elements are float, double, int32, Half, BFloat16 or bool");
      return DType::boolean;
    }
  }

 private:
  template <class T> void check_type() const { QKV_ASSERT(dtype_of<T>() == dtype_, "tensor element type does not match its dtype"); }
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  using Bytes = std::vector<std::byte, tensor_storage::DefaultInitAllocator<std::byte>>;
  Tensor(DType dtype, std::vector<std::int64_t> shape, bool zero);
  /// Copies a view's bytes into bytes_ and lets go of them.
  void own();
  Bytes bytes_;
  const std::byte* view_ = nullptr;  // a view's bytes (bytes_ empty), owned by owner_
  std::size_t view_bytes_ = 0;
  std::shared_ptr<const void> owner_;
};

}  // namespace qkv
