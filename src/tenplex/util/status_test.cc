#include "tenplex/util/status.h"

#include <gtest/gtest.h>

namespace tenplex {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  TP_ASSIGN_OR_RETURN(int h, Half(x));
  TP_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Check(int x) {
  TP_RETURN_IF_ERROR(Quarter(x).status());
  return Status::Ok();
}

TEST(StatusTest, PropagatesErrorsAndValues) {
  EXPECT_EQ(*Quarter(12), 3);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd: 3");
  EXPECT_EQ(r.status().ToString(), "INVALID_ARGUMENT: odd: 3");
  EXPECT_TRUE(Check(8).ok());
  EXPECT_FALSE(Check(10).ok());
  EXPECT_EQ(Check(10).WithContext("ctx").message(), "ctx: odd: 5");
}

TEST(StatusTest, ErrnoMapsCodes) {
  EXPECT_EQ(ErrnoError("open x", ENOENT).code(), StatusCode::kNotFound);
  EXPECT_NE(ErrnoError("open x", ENOENT).message().find("open x: "), std::string::npos);
}

}  // namespace
}  // namespace tenplex
