// test_util.hpp: fixtures shared by the proto tests.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "proto/data_proto.hpp"

namespace tessera::proto::testing {

/// Asserts a Result/Status is ok, printing its error otherwise.
#define ASSERT_OK(expr)                                        \
  do {                                                         \
    auto _st = (expr);                                         \
    ASSERT_TRUE(_st.ok()) << ::tessera::proto::testing::describe(_st); \
  } while (0)

inline std::string describe(const Status& s) { return s.to_string(); }
template <class T>
std::string describe(const Result<T>& r) {
  return r.ok() ? "ok" : r.status().to_string();
}

/// Unwraps a Result in a test (fails the test on error).
template <class T>
T unwrap(Result<T> r) {
  EXPECT_TRUE(r.ok()) << describe(r);
  if (!r.ok()) throw std::runtime_error(r.status().to_string());
  return std::move(r).value();
}

/// Expects an error whose message contains `needle`.
template <class R>
void expect_error(const R& r, ErrorCode code, const std::string& needle) {
  Status s;
  if constexpr (std::is_same_v<R, Status>) {
    s = r;
  } else {
    s = r.status();
  }
  EXPECT_FALSE(s.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "message must be one line";
}

/// n rows: x = arange(n*3) as [n,3] float, ids = 100+arange(n) long,
/// columns uid = "u<i>" (string), score = i/2 (double); meta {"temperature": 0.7}.
inline DataProto make_proto(int64_t n, bool auto_padding = false) {
  TensorDict t;
  t.insert_or_assign("x", torch::arange(n * 3, torch::kFloat).reshape({n, 3}));
  t.insert_or_assign("ids", torch::arange(n, torch::kLong) + 100);
  std::vector<std::string> uid;
  std::vector<double> score;
  for (int64_t i = 0; i < n; ++i) {
    uid.push_back("u" + std::to_string(i));
    score.push_back(i / 2.0);
  }
  NonTensorBatch c;
  c.insert_or_assign("uid", Column::strings(uid));
  c.insert_or_assign("score", Column::doubles(score));
  FromDictOptions opt;
  opt.auto_padding = auto_padding;
  return unwrap(DataProto::from_dict(t, c, nlohmann::json{{"temperature", 0.7}}, opt));
}

/// The uid column of `d` as plain strings.
inline std::vector<std::string> uids(const DataProto& d) {
  std::vector<std::string> out;
  const Column& c = *d.non_tensor_batch().find("uid");
  for (int64_t i = 0; i < c.size(); ++i) out.push_back(c.str(i));
  return out;
}

/// "u<i>" for every i in rows.
inline std::vector<std::string> expected_uids(const std::vector<int64_t>& rows) {
  std::vector<std::string> out;
  for (int64_t r : rows) out.push_back("u" + std::to_string(r));
  return out;
}

/// True if `t`'s data lies inside `base`'s storage (a view, not a copy).
inline bool shares_storage(const at::Tensor& t, const at::Tensor& base) {
  return t.storage().is_alias_of(base.storage());
}

}  // namespace tessera::proto::testing
