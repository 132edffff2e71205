// ppo_inputs.hpp: reading what DataParallelPPOActor / DataParallelPPOCritic are given: verl
// config mappings (unknown keys are errors naming the key), meta_info entries, and the padded
// sequence tensors of a PPO batch, each checked with an error that names the key and shape. Also
// the one place where LibTorch exceptions become Status values for this component.
//
// Thread-safety: free functions are pure; a ConfigReader is used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/device.hpp"
#include "proto/status.hpp"

namespace tessera::ppo {

// ---- Config parsing -----------------------------------------------------------------------------

/// Reads one verl config mapping into typed fields, keeping the first error. Every key of the
/// mapping must be consumed by field() or skip(); finish() reports the first other key as unknown,
/// naming its full path ("actor_rollout_ref.actor.ppo_epoch: unknown key"). JSON null is accepted
/// for std::optional fields (nullopt) and for skipped keys; elsewhere it is a type error.
/// Not thread-safe (one reader per parse).
class ConfigReader {
 public:
  /// `json` must be an object (or null: no keys); `path` prefixes every error.
  // REQUIRES: `json` outlives the reader (it is held by reference).
  ConfigReader(const nlohmann::json& json, std::string path);

  /// Reads `key` into `out` when present (left unchanged when absent); a value of the wrong JSON
  /// type records "<path>.<key>: expected <type>, got <value>".
  void field(const char* key, int64_t& out);
  void field(const char* key, std::optional<int64_t>& out);
  void field(const char* key, double& out);
  void field(const char* key, std::optional<double>& out);
  void field(const char* key, bool& out);
  void field(const char* key, std::string& out);
  /// Marks `key` as known and returns its value (null when absent), for nested mappings.
  const nlohmann::json& nested(const char* key);
  /// Marks `key` as known without reading it (a key owned by another component).
  void skip(const char* key);
  /// Records `status` as the error if none is recorded yet.
  void fail(Status status);
  /// The full path of `key` ("path.key").
  std::string key_path(const char* key) const;

  /// The first error, or the first unconsumed key as invalid_argument "<path>.<key>: unknown key".
  Status finish() const;

 private:
  const nlohmann::json* find(const char* key);
  template <class T>
  void read_value(const char* key, T& out, const char* type_name, bool (nlohmann::json::*is)() const noexcept);

  const nlohmann::json& json_;
  std::string path_;
  std::vector<std::string> known_;
  Status first_error_;
};

/// "<path>.<key>", or `key` alone when `path` is empty (how config errors name a key).
std::string config_key(const std::string& path, const char* key);

/// invalid_argument "<key> = '<value>' is not one of: a, b, ..." unless `value` is in `allowed`.
Status check_one_of(const std::string& value, const std::vector<std::string>& allowed, const std::string& key);

/// invalid_argument "<key> = <value> must be >= 1" unless `value` >= 1.
Status check_positive(const std::string& key, int64_t value);

// ---- Shared plumbing ----------------------------------------------------------------------------

/// The in-flight exception as a one-line Status (proto/device.hpp).
using proto::status_from_current_exception;

/// Runs `fn()`; an exception it throws is returned as a Status naming `context`.
template <class Fn>
auto guarded_call(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    return status_from_current_exception(context);
  }
}

/// Runs `update()`; if it throws, ends `module`'s forward and drops its gradients so the next call
/// starts clean, and returns the exception as a Status naming `context`.
template <class Module, class Fn>
auto guarded_update(Module& module, const std::string& context, Fn&& update) -> decltype(update()) {
  try {
    return update();
  } catch (...) {
    Status st = status_from_current_exception(context);
    (void)module.end_forward();
    module.zero_grad();
    return st;
  }
}

/// A number from meta_info[key]; not_found / invalid_argument name `meta_info.<key>`.
Result<double> meta_number(const nlohmann::json& meta_info, const std::string& key);
/// A bool from meta_info[key]; errors as meta_number.
Result<bool> meta_bool(const nlohmann::json& meta_info, const std::string& key);
/// A positive integer from meta_info[key]; errors as meta_number, plus < 1.
Result<int64_t> meta_positive_int(const nlohmann::json& meta_info, const std::string& key);

// ---- Batch tensors ------------------------------------------------------------------------------

/// The padded sequence tensors every PPO forward reads (verl's layout: prompt left-padded,
/// response right-padded, T = prompt + response length).
struct SequenceBatch {
  at::Tensor input_ids;       ///< [B, T] integral.
  at::Tensor attention_mask;  ///< [B, T].
  at::Tensor position_ids;    ///< [B, T] integral.
  at::Tensor responses;       ///< [B, R] integral, 0 < R < T.
  int64_t response_length = 0;  ///< R.
};

/// Reads and checks input_ids, attention_mask, position_ids, responses. Errors name the missing
/// key, or the key and its shape / dtype.
Result<SequenceBatch> read_sequence_batch(const proto::DataProto& data);

/// `key` as a floating [B, R] tensor; errors name the key and shape (not_found when missing).
Result<at::Tensor> read_response_tensor(const proto::DataProto& data, const std::string& key,
                                        const SequenceBatch& seq);

/// response_mask [B, R] if present (shape checked, any dtype), else attention_mask[:, -R:] (verl's
/// compute_response_mask). Returned in its stored dtype; the losses cast masks themselves.
Result<at::Tensor> read_response_mask(const proto::DataProto& data, const SequenceBatch& seq);

/// Errors (unimplemented) when the batch carries `multi_modal_inputs`, which this forward does
/// not feed to the model.
Status check_text_only(const proto::DataProto& data);

}  // namespace tessera::ppo
