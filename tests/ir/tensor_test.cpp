// qkv::Tensor's storage: zero-filled by its constructor, left unset by uninitialized() for a
// caller that writes every element, both sized and checked alike.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "ir/tensor.hpp"

namespace qkv {
namespace {

TEST(Tensor, ConstructedZeroUninitializedSizedAlike) {
  const Tensor zeros(DType::f32, {3, 5});
  ASSERT_EQ(zeros.nbytes(), 60u);
  for (std::int64_t i = 0; i < zeros.numel(); ++i) EXPECT_EQ(zeros.at(i), 0.0);

  Tensor out = Tensor::uninitialized(DType::i32, {2, 7});
  EXPECT_EQ(out.dtype(), DType::i32);
  EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{2, 7}));
  ASSERT_EQ(out.nbytes(), 56u);
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data<std::int32_t>()[i] = static_cast<std::int32_t>(i * 3);
  const Tensor copy = out;  // copies keep the values
  for (std::int64_t i = 0; i < copy.numel(); ++i) EXPECT_EQ(copy.at(i), static_cast<double>(i * 3));
  EXPECT_EQ(Tensor::uninitialized(DType::boolean, {0, 4}).nbytes(), 0u);

  // Sizes are checked as the constructor checks them.
  EXPECT_THROW(Tensor::uninitialized(DType::f32, {-1, 2}), ShapeError);
  EXPECT_THROW(Tensor::uninitialized(DType::f32, {std::numeric_limits<std::int64_t>::max(), 4}), ShapeError);
}

}  // namespace
}  // namespace qkv
