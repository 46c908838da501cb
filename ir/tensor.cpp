// Host tensors.
#include "ir/tensor.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

namespace qkv {

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t count(const std::vector<std::int64_t>& shape, std::size_t elem_size = 1) {
  for (auto d : shape)
    if (d < 0) throw ShapeError("tensor: negative dim " + std::to_string(d) + " in shape " + shape_text(shape));
  auto n = Tensor::checked_numel(shape, elem_size);
  if (!n) throw ShapeError("tensor: shape " + shape_text(shape) + " has more elements than memory can address");
  return *n;
}

template <class Bytes> Bytes allocate(DType dtype, const std::vector<std::int64_t>& shape, bool zero) {
  const auto bytes = static_cast<std::size_t>(count(shape, dtype_size(dtype))) * dtype_size(dtype);
  try {
    Bytes b(bytes);  // not set; zeroed at once where asked (through the allocator, byte by byte)
    if (zero && bytes) std::memset(b.data(), 0, bytes);
    return b;
  } catch (const std::bad_alloc&) {
    throw ResourceError("out of memory: " + std::string(dtype_name(dtype)) + shape_text(shape) + " needs " + std::to_string(bytes) + " bytes");
  }
}

}  // namespace

namespace tensor_storage {

void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: a refusal changes nothing
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace tensor_storage

std::optional<std::int64_t> Tensor::checked_numel(const std::vector<std::int64_t>& shape, std::size_t elem_size) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const auto size = static_cast<std::int64_t>(elem_size == 0 ? 1 : elem_size);
  std::int64_t n = 1;
  bool zero = false;
  for (auto d : shape) {
    if (d < 0) return std::nullopt;
    zero |= d == 0;
    if (d != 0 && n > kMax / d) {
      if (!zero) n = -1;  // overflow, unless a later dim is 0 (checked below)
      continue;
    }
    if (n >= 0) n *= d;
  }
  if (zero) return 0;
  if (n < 0 || n > kMax / size) return std::nullopt;
  return n;
}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape) : Tensor(dtype, std::move(shape), true) {}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape, bool zero)
    : dtype_(dtype), shape_(std::move(shape)), bytes_(allocate<Bytes>(dtype_, shape_, zero)) {}

Tensor Tensor::uninitialized(DType dtype, std::vector<std::int64_t> shape) { return Tensor(dtype, std::move(shape), false); }

Tensor::Tensor(const Tensor& other)
    : dtype_(other.dtype_), shape_(other.shape_), bytes_(other.bytes_.size()), view_(other.view_), view_bytes_(other.view_bytes_),
      owner_(other.owner_) {
  if (!bytes_.empty()) std::memcpy(bytes_.data(), other.bytes_.data(), bytes_.size());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : dtype_(other.dtype_), shape_(std::move(other.shape_)), bytes_(std::move(other.bytes_)), view_(std::exchange(other.view_, nullptr)),
      view_bytes_(std::exchange(other.view_bytes_, 0)), owner_(std::move(other.owner_)) {
  other.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  dtype_ = other.dtype_;
  shape_ = std::move(other.shape_);
  bytes_ = std::move(other.bytes_);
  view_ = std::exchange(other.view_, nullptr);
  view_bytes_ = std::exchange(other.view_bytes_, 0);
  owner_ = std::move(other.owner_);
  other.shape_.clear();
  other.bytes_.clear();
  return *this;
}

Tensor Tensor::view(DType dtype, std::vector<std::int64_t> shape, const std::byte* data, std::size_t nbytes, std::shared_ptr<const void> owner) {
  const auto size = static_cast<std::size_t>(count(shape, dtype_size(dtype))) * dtype_size(dtype);
  if (size != nbytes) throw ShapeError("tensor: " + std::to_string(nbytes) + " bytes for " + std::string(dtype_name(dtype)) + shape_text(shape));
  QKV_ASSERT(reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) == 0, "a tensor view's bytes are aligned to its elements");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  if (nbytes == 0) return t;
  t.view_ = data;
  t.view_bytes_ = nbytes;
  t.owner_ = std::move(owner);
  return t;
}

void Tensor::own() {
  Bytes copy = allocate<Bytes>(dtype_, shape_, false);
  std::memcpy(copy.data(), view_, view_bytes_);
  bytes_ = std::move(copy);
  view_ = nullptr;
  view_bytes_ = 0;
  owner_.reset();
}

std::int64_t Tensor::numel() const { return count(shape_); }

double Tensor::at(std::int64_t i) const {
  switch (dtype_) {
    case DType::f32: return data<float>()[i];
    case DType::f64: return data<double>()[i];
    case DType::boolean: return data<std::uint8_t>()[i] ? 1.0 : 0.0;
    case DType::i32: return data<std::int32_t>()[i];
    case DType::f16: return to_float(data<Half>()[i]);
    case DType::bf16: return to_float(data<BFloat16>()[i]);
  }
  QKV_UNREACHABLE("dtype");
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  std::int64_t n = numel();
  // Between f32 and the half formats: the vectorised conversions.
  if (dtype_ == DType::f32 && is_half(dtype)) {
    Tensor r = uninitialized(dtype, shape_);
    if (dtype == DType::f16) to_half(data<float>(), r.data<Half>(), n);
    else to_bfloat16(data<float>(), r.data<BFloat16>(), n);
    return r;
  }
  if (is_half(dtype_) && dtype == DType::f32) {
    Tensor r = uninitialized(dtype, shape_);
    if (dtype_ == DType::f16) to_float(data<Half>(), r.data<float>(), n);
    else to_float(data<BFloat16>(), r.data<float>(), n);
    return r;
  }
  Tensor r(dtype, shape_);
  for (std::int64_t i = 0; i < n; ++i) {
    double v = at(i);
    switch (dtype) {
      case DType::f32: r.data<float>()[i] = static_cast<float>(v); break;
      case DType::f64: r.data<double>()[i] = v; break;
      case DType::boolean: r.data<std::uint8_t>()[i] = v != 0.0; break;
      case DType::i32: r.data<std::int32_t>()[i] = static_cast<std::int32_t>(v); break;
      case DType::f16: r.data<Half>()[i] = to_half(v); break;
      case DType::bf16: r.data<BFloat16>()[i] = to_bfloat16(v); break;
    }
  }
  return r;
}

Tensor Tensor::reshaped(std::vector<std::int64_t> shape) const {
  if (count(shape) != numel()) throw ShapeError("tensor: cannot reshape " + type_string() + " to " + std::to_string(count(shape)) + " elements");
  Tensor r = *this;
  r.shape_ = std::move(shape);
  return r;
}

std::string Tensor::type_string() const {
  std::string s(dtype_name(dtype_));
  s += '[';
  for (std::size_t i = 0; i < shape_.size(); ++i) s += (i ? "," : "") + std::to_string(shape_[i]);
  return s + ']';
}

}  // namespace qkv
