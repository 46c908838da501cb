// The error family: every kind maps to its exit status in one place.
#include <gtest/gtest.h>

#include "ir/error.hpp"

namespace qkv {
namespace {

TEST(ErrorFamily, WhatTheUserCanFixExitsTwoFailuresOne) {
  EXPECT_EQ(exit_code(UsageError("u")), 2);
  EXPECT_EQ(exit_code(ShapeError("s")), 2);
  EXPECT_EQ(exit_code(IoError("i")), 2);
  EXPECT_EQ(exit_code(IrError("r")), 2);
  EXPECT_EQ(exit_code(UnsupportedError("n")), 2);
  EXPECT_EQ(exit_code(BackendError("b")), 1);
  EXPECT_EQ(exit_code(ResourceError("m")), 1);
  EXPECT_EQ(exit_code(Error("e")), 1);
}

TEST(ErrorFamilyDeathTest, AssertionsReportOurOwnBugsAndAbort) {
  EXPECT_DEATH(QKV_ASSERT(1 + 1 == 3, "arithmetic"), "qkv internal error: arithmetic \\(1 \\+ 1 == 3\\)");
}

}  // namespace
}  // namespace qkv
