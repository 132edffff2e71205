// `tessera generate --model DIR --prompt TEXT...`: quick inference with the KV-cache engine.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "app/commands.hpp"
#include "proto/device.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/models/model_io.hpp"
#include "workers/tokenizer/tokenizer.hpp"
#include "workers/rollout/kv_engine.hpp"

namespace tessera::app {
namespace {

struct GenerateArgs {
  std::string model;
  std::vector<std::string> prompts;
  bool chat = false;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype = "auto";  // auto: the checkpoint's
  bool cuda_graphs = false;    // rollout.enforce_eager=false
};

// --dtype: auto (the checkpoint's), float32, bfloat16 or float16.
Result<std::optional<c10::ScalarType>> parse_dtype(const std::string& name) {
  if (name == "auto") return std::optional<c10::ScalarType>();
  if (name == "float32" || name == "fp32") return std::optional<c10::ScalarType>(c10::ScalarType::Float);
  if (name == "bfloat16" || name == "bf16") return std::optional<c10::ScalarType>(c10::ScalarType::BFloat16);
  if (name == "float16" || name == "fp16") return std::optional<c10::ScalarType>(c10::ScalarType::Half);
  return make_error(ErrorCode::invalid_argument, "--dtype {}: expected auto, float32, bfloat16 or float16", name);
}

// Left-padded prompt batch with the rollout contract's meta_info.
Result<proto::DataProto> prompt_batch(const std::vector<std::vector<int32_t>>& ids, int64_t pad, int64_t eos) {
  int64_t P = 0;
  for (const auto& p : ids) P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  const auto B = static_cast<int64_t>(ids.size());
  at::Tensor input = torch::full({B, P}, pad, torch::kInt64), mask = torch::zeros({B, P}, torch::kInt64);
  for (int64_t i = 0; i < B; ++i) {
    const auto L = static_cast<int64_t>(ids[static_cast<size_t>(i)].size());
    for (int64_t j = 0; j < L; ++j) input[i][P - L + j] = ids[static_cast<size_t>(i)][static_cast<size_t>(j)];
    mask[i].narrow(0, P - L, L).fill_(1);
  }
  at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto d,
                           proto::DataProto::from_dict({{"input_ids", input}, {"attention_mask", mask}, {"position_ids", pos}}));
  d.meta_info()["eos_token_id"] = eos;
  d.meta_info()["pad_token_id"] = pad;
  return d;
}

Result<std::vector<std::vector<int32_t>>> encode_prompts(const tokenizer::Tokenizer& tok, const GenerateArgs& a) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : a.prompts) {
    std::string text = p;
    if (a.chat) {
      TESSERA_ASSIGN_OR_RETURN(auto tmpl, tokenizer::ChatTemplate::from_name("auto", tok.config()));
      TESSERA_ASSIGN_OR_RETURN(text, tmpl.render({{"user", p}}, /*add_generation_prompt=*/true));
    }
    TESSERA_ASSIGN_OR_RETURN(auto ids, tok.encode(text));
    if (ids.empty()) return make_error(ErrorCode::invalid_argument, "--prompt '{}' encodes to no tokens", p);
    out.push_back(std::move(ids));
  }
  return out;
}

Status generate(const GenerateArgs& a) {
  models::LoadOptions load;
  TESSERA_ASSIGN_OR_RETURN(load.dtype, parse_dtype(a.dtype));
  TESSERA_ASSIGN_OR_RETURN(c10::Device device, proto::parse_device(a.device));
  TESSERA_RETURN_IF_ERROR(proto::require_device(device).with_context("--device"));
  load.device = device;
  proto::DeviceScope on_device(device);
  TESSERA_ASSIGN_OR_RETURN(auto model, models::load_causal_lm(a.model, load));
  TESSERA_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_dir(a.model));
  const auto eos = tok.eos_token_id();
  if (!eos) return make_error(ErrorCode::invalid_argument, "{}: the tokenizer has no eos_token", a.model);
  const int64_t pad = tok.pad_token_id().value_or(*eos);
  TESSERA_ASSIGN_OR_RETURN(auto ids, encode_prompts(tok, a));
  int64_t P = 0;
  for (const auto& p : ids) P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  rollout::RolloutConfig rc;
  rc.dtype = "auto";
  rc.prompt_length = P;
  rc.response_length = a.max_new_tokens;
  rc.temperature = a.temperature > 0 ? a.temperature : 1.0;
  rc.do_sample = a.temperature > 0;
  rc.enforce_eager = !a.cuda_graphs;
  TESSERA_ASSIGN_OR_RETURN(auto engine, rollout::KVCacheEngine::create(model, rc, rollout::EngineOptions{a.seed}));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, prompt_batch(ids, pad, *eos));
  TESSERA_RETURN_IF_ERROR(batch.to(device));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, engine->generate_sequences(batch));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, out.tensor("responses"));
  responses = responses.to(at::kCPU);  // read token by token below, to print them
  for (size_t i = 0; i < a.prompts.size(); ++i) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < responses.size(1); ++j) {
      const auto t = static_cast<int32_t>(responses[static_cast<int64_t>(i)][j].item<int64_t>());
      if (t == *eos || t == pad) break;
      row.push_back(t);
    }
    TESSERA_ASSIGN_OR_RETURN(std::string text, tok.decode(row, {/*skip_special_tokens=*/true, /*lossy_utf8=*/true}));
    std::printf("%s%s\n", a.prompts.size() > 1 ? fmt::format("[{}] ", i).c_str() : "", text.c_str());
  }
  return Status();
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Quick inference: complete prompts with an HF model directory");
  static GenerateArgs args;
  cmd->add_option("--model", args.model, "HF model directory (config.json, safetensors, tokenizer files)")->required();
  cmd->add_option("--prompt", args.prompts, "prompt text (repeatable)")->required();
  cmd->add_flag("--chat", args.chat, "render each prompt as one user message with the tokenizer's chat template");
  cmd->add_option("--max-new-tokens", args.max_new_tokens, "response length limit")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args.temperature, "0 (default): greedy; > 0: sampling")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args.seed, "sampling seed");
  cmd->add_option("--device", args.device, "where the model runs: cpu (default) or cuda[:I]");
  cmd->add_option("--dtype", args.dtype, "parameter dtype: auto (the checkpoint's, default), float32, bfloat16, float16");
  cmd->add_flag("--cuda-graphs", args.cuda_graphs,
                "on a CUDA device, replay decode steps from CUDA graphs (rollout.enforce_eager=false)");
  cmd->callback([] {
    Status st = generate(args);
    if (!st.ok()) std::fprintf(stderr, "tessera generate: %s\n", st.to_string().c_str());
    exit_code() = st.ok() ? 0 : 1;
  });
}

}  // namespace tessera::app
