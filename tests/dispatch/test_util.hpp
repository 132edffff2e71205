// Helpers shared by the dispatch tests: small DataProtos whose rows are easy to identify.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "proto/data_proto.hpp"

namespace tessera::dispatch::testing {

/// n rows: "x" = [[i, 10*i]] (int64), "y" = i * 0.5 (float), column "uid" = "row<i>".
inline proto::DataProto rows(int64_t n, bool auto_padding = false) {
  proto::TensorDict t;
  auto i = torch::arange(n, torch::kInt64);
  t.insert_or_assign("x", torch::stack({i, i * 10}, 1));
  t.insert_or_assign("y", i.to(torch::kFloat32) * 0.5);
  std::vector<std::string> uid;
  for (int64_t k = 0; k < n; ++k) uid.push_back("row" + std::to_string(k));
  proto::NonTensorBatch nt;
  nt.insert_or_assign("uid", proto::Column::strings(uid));
  proto::FromDictOptions o;
  o.auto_padding = auto_padding;
  auto d = proto::DataProto::from_dict(std::move(t), std::move(nt), nlohmann::json::object(), o);
  if (!d.ok()) throw std::runtime_error(d.status().to_string());
  return *d;
}

/// The row ids (column 0 of "x") of a DataProto, in order.
inline std::vector<int64_t> ids(const proto::DataProto& d) {
  auto x = d.tensor("x");
  if (!x.ok()) throw std::runtime_error(x.status().to_string());
  auto col = x->select(1, 0).contiguous();
  return std::vector<int64_t>(col.data_ptr<int64_t>(), col.data_ptr<int64_t>() + col.numel());
}

/// The "rank" column (int64) each worker writes into its rows, in row order.
inline std::vector<int64_t> rank_column(const proto::DataProto& d) {
  auto t = d.tensor("rank");
  if (!t.ok()) throw std::runtime_error(t.status().to_string());
  auto col = t->contiguous();
  return std::vector<int64_t>(col.data_ptr<int64_t>(), col.data_ptr<int64_t>() + col.numel());
}

/// 0, 1, ..., n-1.
inline std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

/// Row i of n rows, chunked into `world` ceil-sized pieces after padding, is on rank i / per.
inline std::vector<int64_t> owners(int64_t n, int64_t world) {
  int64_t padded = n + (world - n % world) % world;
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(i / (padded / world));
  return v;
}

}  // namespace tessera::dispatch::testing
