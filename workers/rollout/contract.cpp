// contract.cpp: reading and writing verl's generate_sequences batches. See contract.hpp.
#include "workers/rollout/contract.hpp"

#include <torch/torch.h>

namespace tessera::rollout {
namespace {

Result<int64_t> meta_int(const nlohmann::json& v, const char* key) {
  if (!v.is_number_integer()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: meta_info.{} must be an integer, got {}", key,
                      v.dump().substr(0, 60));
  }
  return v.get<int64_t>();
}

Result<bool> meta_bool(const nlohmann::json& meta, const char* key, bool fallback) {
  auto it = meta.find(key);
  if (it == meta.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: meta_info.{} must be a boolean, got {}", key,
                      it->dump().substr(0, 60));
  }
  return it->get<bool>();
}

// meta_info.eos_token_id: an int or a non-empty list of ints (verl accepts both).
Result<std::vector<int64_t>> read_eos(const nlohmann::json& meta) {
  auto it = meta.find("eos_token_id");
  if (it == meta.end() || it->is_null()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: meta_info.eos_token_id is missing");
  }
  std::vector<int64_t> ids;
  if (it->is_array()) {
    for (const auto& v : *it) {
      TESSERA_ASSIGN_OR_RETURN(int64_t id, meta_int(v, "eos_token_id[]"));
      ids.push_back(id);
    }
    if (ids.empty()) return make_error(ErrorCode::invalid_argument, "generate_sequences: meta_info.eos_token_id is []");
    return ids;
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t id, meta_int(*it, "eos_token_id"));
  return std::vector<int64_t>{id};
}

Status check_shapes(const GenerationInputs& in) {
  const at::Tensor& ids = in.input_ids;
  if (ids.dim() != 2 || !at::isIntegralType(ids.scalar_type(), /*includeBool=*/false)) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: input_ids must be a 2-D integer tensor, got {}-D {}",
                      ids.dim(), c10::toString(ids.scalar_type()));
  }
  if (in.attention_mask.sizes() != ids.sizes()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: attention_mask shape {} != input_ids shape {}",
                      fmt::join(in.attention_mask.sizes(), ","), fmt::join(ids.sizes(), ","));
  }
  if (in.position_ids.dim() == 3) {
    return make_error(ErrorCode::unimplemented, "generate_sequences: 3-D (mrope) position_ids are not supported");
  }
  if (in.position_ids.sizes() != ids.sizes()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: position_ids shape {} != input_ids shape {}",
                      fmt::join(in.position_ids.sizes(), ","), fmt::join(ids.sizes(), ","));
  }
  if (ids.size(1) == 0) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: input_ids has no columns ({} x 0)", ids.size(0));
  }
  return Status();
}

// Rows must be left-padded: 0...0 1...1 with at least one 1. The prompt is the 1-part.
Status strip_left_pads(GenerationInputs& in) {
  at::Tensor ids = in.input_ids.to(at::kCPU).to(at::kLong).contiguous();
  at::Tensor mask = in.attention_mask.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t B = ids.size(0), P = ids.size(1);
  auto id = ids.accessor<int64_t, 2>();
  auto m = mask.accessor<int64_t, 2>();
  in.prompts.assign(static_cast<size_t>(B), {});
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    while (start < P && m[b][start] == 0) ++start;
    if (start == P) return make_error(ErrorCode::invalid_argument, "generate_sequences: row {} has an empty prompt", b);
    for (int64_t t = start; t < P; ++t) {
      if (m[b][t] != 1) {
        return make_error(ErrorCode::invalid_argument,
                          "generate_sequences: attention_mask row {} is not left-padded (value {} at column {})", b,
                          m[b][t], t);
      }
      in.prompts[static_cast<size_t>(b)].push_back(id[b][t]);
    }
  }
  return Status();
}

}  // namespace

Result<GenerationInputs> read_generation_inputs(const proto::DataProto& batch, bool default_do_sample) {
  GenerationInputs in;
  TESSERA_ASSIGN_OR_RETURN(in.input_ids, batch.tensor("input_ids"));
  TESSERA_ASSIGN_OR_RETURN(in.attention_mask, batch.tensor("attention_mask"));
  TESSERA_ASSIGN_OR_RETURN(in.position_ids, batch.tensor("position_ids"));
  TESSERA_RETURN_IF_ERROR(check_shapes(in));
  const nlohmann::json& meta = batch.meta_info();
  TESSERA_ASSIGN_OR_RETURN(in.eos_token_ids, read_eos(meta));
  auto pad = meta.find("pad_token_id");
  if (pad == meta.end() || pad->is_null()) {
    return make_error(ErrorCode::invalid_argument, "generate_sequences: meta_info.pad_token_id is missing");
  }
  TESSERA_ASSIGN_OR_RETURN(in.pad_token_id, meta_int(*pad, "pad_token_id"));
  TESSERA_ASSIGN_OR_RETURN(in.do_sample, meta_bool(meta, "do_sample", default_do_sample));
  TESSERA_ASSIGN_OR_RETURN(in.validate, meta_bool(meta, "validate", false));
  TESSERA_RETURN_IF_ERROR(strip_left_pads(in));
  return in;
}

at::Tensor get_response_mask(const at::Tensor& responses, const std::vector<int64_t>& eos_token_ids,
                             c10::ScalarType dtype) {
  at::Tensor eos = at::tensor(eos_token_ids, at::TensorOptions().dtype(at::kLong).device(responses.device()));
  at::Tensor is_eos = at::isin(responses.to(at::kLong), eos).to(at::kLong);
  return (is_eos.cumsum(1) - is_eos).eq(0).to(dtype);
}

Result<proto::DataProto> build_generation_output(const proto::DataProto& batch, const GenerationInputs& in,
                                                 const std::vector<GeneratedRow>& rows, int64_t response_length,
                                                 bool with_logprobs) {
  const int64_t B = in.input_ids.size(0), R = response_length;
  if (static_cast<int64_t>(rows.size()) != B) {
    return make_error(ErrorCode::internal, "generate_sequences: {} generated rows for a batch of {}", rows.size(), B);
  }
  at::Tensor responses = at::full({B, R}, in.pad_token_id, at::kLong);
  at::Tensor logprobs = at::full({B, R}, -1.0, at::kFloat);
  auto resp = responses.accessor<int64_t, 2>();
  auto lp = logprobs.accessor<float, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const GeneratedRow& row = rows[static_cast<size_t>(b)];
    if (static_cast<int64_t>(row.tokens.size()) > R || (with_logprobs && row.logprobs.size() != row.tokens.size())) {
      return make_error(ErrorCode::internal, "generate_sequences: row {} has {} tokens / {} log-probs (R = {})", b,
                        row.tokens.size(), row.logprobs.size(), R);
    }
    for (size_t t = 0; t < row.tokens.size(); ++t) {
      resp[b][static_cast<int64_t>(t)] = row.tokens[t];
      if (with_logprobs) lp[b][static_cast<int64_t>(t)] = row.logprobs[t];
    }
  }
  const at::Device device = in.input_ids.device();
  responses = responses.to(device).to(in.input_ids.scalar_type());
  at::Tensor response_mask = get_response_mask(responses, in.eos_token_ids, in.attention_mask.scalar_type());
  at::Tensor delta = at::arange(1, R + 1, in.position_ids.options()).unsqueeze(0);
  at::Tensor response_positions = in.position_ids.narrow(1, in.position_ids.size(1) - 1, 1) + delta;

  proto::TensorDict tensors;
  tensors.insert_or_assign("prompts", in.input_ids);
  tensors.insert_or_assign("responses", responses);
  tensors.insert_or_assign("input_ids", at::cat({in.input_ids, responses}, 1));
  tensors.insert_or_assign("attention_mask", at::cat({in.attention_mask, response_mask}, 1));
  tensors.insert_or_assign("position_ids", at::cat({in.position_ids, response_positions}, 1));
  if (with_logprobs) tensors.insert_or_assign("rollout_log_probs", logprobs.to(device));
  proto::NonTensorBatch columns;
  for (const auto& [key, column] : batch.non_tensor_batch()) {
    if (key != "raw_prompt_ids" && key != "multi_modal_data") columns.insert_or_assign(key, column);
  }
  return proto::DataProto::from_dict(std::move(tensors), std::move(columns));
}

Result<proto::DataProto> build_conversation_output(const proto::DataProto& batch, const GenerationInputs& in,
                                                   const std::vector<ConversationTokens>& rows, int64_t P, int64_t R,
                                                   bool with_logprobs, proto::NonTensorBatch added) {
  const auto bs = static_cast<int64_t>(rows.size());
  const auto mask_dtype = in.attention_mask.scalar_type();
  at::Tensor prompt_ids = at::full({bs, P}, in.pad_token_id, at::kLong);
  at::Tensor responses = at::full({bs, R}, in.pad_token_id, at::kLong);
  at::Tensor attention = at::zeros({bs, P + R}, at::kLong);
  at::Tensor positions = at::zeros({bs, P + R}, at::kLong);
  at::Tensor response_mask = at::zeros({bs, R}, at::kLong);
  at::Tensor logprobs = at::full({bs, R}, -1.0, at::kFloat);
  auto ids_a = prompt_ids.accessor<int64_t, 2>();
  auto resp_a = responses.accessor<int64_t, 2>();
  auto att_a = attention.accessor<int64_t, 2>();
  auto pos_a = positions.accessor<int64_t, 2>();
  auto rm_a = response_mask.accessor<int64_t, 2>();
  auto lp_a = logprobs.accessor<float, 2>();
  std::vector<int64_t> num_turns;
  for (int64_t r = 0; r < bs; ++r) {
    const ConversationTokens& c = rows[static_cast<size_t>(r)];
    const auto n = static_cast<int64_t>(c.prompt.size()), m = static_cast<int64_t>(c.response.size());
    if (n < 1 || n > P || m > R || c.mask.size() != c.response.size() ||
        (with_logprobs && c.logprobs.size() != c.response.size())) {
      return make_error(ErrorCode::internal, "generate_sequences: row {} has {} prompt and {} response tokens, {} mask "
                        "values (P = {}, R = {})", r, n, m, c.mask.size(), P, R);
    }
    const int64_t offset = P - n;
    for (int64_t j = 0; j < n; ++j) {
      ids_a[r][offset + j] = c.prompt[static_cast<size_t>(j)];
      att_a[r][offset + j] = 1;
      pos_a[r][offset + j] = j;
    }
    for (int64_t j = 0; j < R; ++j) pos_a[r][P + j] = n + j;  // continuing under padding, as generate_sequences
    for (int64_t j = 0; j < m; ++j) {
      resp_a[r][j] = c.response[static_cast<size_t>(j)];
      att_a[r][P + j] = 1;
      rm_a[r][j] = c.mask[static_cast<size_t>(j)];
      if (with_logprobs) lp_a[r][j] = c.logprobs[static_cast<size_t>(j)];
    }
    num_turns.push_back(c.num_turns);
  }
  const c10::Device device = in.input_ids.device();
  prompt_ids = prompt_ids.to(device), responses = responses.to(device), attention = attention.to(device);
  positions = positions.to(device), response_mask = response_mask.to(device), logprobs = logprobs.to(device);
  proto::TensorDict tensors;
  tensors.insert_or_assign("prompts", prompt_ids);
  tensors.insert_or_assign("responses", responses);
  tensors.insert_or_assign("input_ids", at::cat({prompt_ids, responses}, 1));
  tensors.insert_or_assign("attention_mask", attention.to(mask_dtype));
  tensors.insert_or_assign("position_ids", positions);
  tensors.insert_or_assign("response_mask", response_mask.to(mask_dtype));
  if (with_logprobs) tensors.insert_or_assign("rollout_log_probs", logprobs);
  proto::NonTensorBatch columns;
  for (const auto& [key, column] : batch.non_tensor_batch()) {
    if (key != "raw_prompt_ids" && key != "multi_modal_data") columns.insert_or_assign(key, column);
  }
  for (auto& [key, column] : added) columns.insert_or_assign(key, std::move(column));
  columns.insert_or_assign("__num_turns__", proto::Column::int64s(std::move(num_turns)));
  return proto::DataProto::from_dict(std::move(tensors), std::move(columns));
}

}  // namespace tessera::rollout
