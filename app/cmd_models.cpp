// `tessera init-model`: writes a small randomly initialised HF model directory
// (tessera::models::init_model does the work; this file only maps flags to options).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "app/commands.hpp"
#include "workers/models/init_model.hpp"

namespace tessera::app {

void add_model_commands(CLI::App& app) {
  auto opts = std::make_shared<models::InitModelOptions>();
  auto vocab = std::make_shared<int64_t>(0);
  CLI::App* cmd = app.add_subcommand("init-model", "Write a small randomly initialised HF model directory");
  cmd->add_option("--arch", opts->arch, "Model family: llama | qwen2 | qwen3 | qwen2_moe | qwen3_moe | mistral | gemma2 | gemma3_text")
      ->required()
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "gemma2", "gemma3_text"}));
  cmd->add_option("--hidden", opts->hidden, "hidden_size")->required();
  cmd->add_option("--layers", opts->layers, "num_hidden_layers")->required();
  cmd->add_option("--heads", opts->heads, "num_attention_heads")->required();
  cmd->add_option("--kv-heads", opts->kv_heads, "num_key_value_heads (default: --heads)");
  cmd->add_option("--head-dim", opts->head_dim, "head_dim (default: --hidden / --heads)");
  cmd->add_option("--sliding-window", opts->sliding_window, "mistral, gemma2, gemma3_text: sliding_window (default: none for mistral, 4096 for the Gemmas)");
  cmd->add_option("--intermediate", opts->intermediate, "intermediate_size (default: 8/3 hidden, rounded to 64)");
  cmd->add_option("--experts", opts->experts, "qwen3_moe, qwen2_moe: num_experts (default: HF's, 128 and 60)");
  cmd->add_option("--experts-per-tok", opts->experts_per_tok, "MoE: num_experts_per_tok (default: HF's, 8 and 4)");
  cmd->add_option("--moe-intermediate", opts->moe_intermediate, "MoE: moe_intermediate_size (default: HF's)");
  cmd->add_option("--shared-expert-intermediate", opts->shared_expert_intermediate,
                  "qwen2_moe: shared_expert_intermediate_size (default: 4 x --moe-intermediate)");
  cmd->add_flag("--norm-topk-prob", opts->norm_topk_prob, "MoE: renormalise the top-k routing weights (Qwen3-MoE's releases)");
  cmd->add_option("--tokenizer", opts->tokenizer, "bytes | chars:ALPHABET | PATH to a tokenizer directory")->required();
  cmd->add_option("--seed", opts->seed, "Initialisation seed")->required();
  cmd->add_option("--out", opts->out, "Directory to create")->required();
  cmd->add_option("--vocab-size", *vocab, "vocab_size (default: the tokenizer's; may only pad it up)");
  cmd->add_option("--max-position", opts->max_position, "max_position_embeddings")->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "float32 | bfloat16 | float16")->capture_default_str();
  cmd->add_option("--rope-theta", opts->rope_theta, "rope_theta (default: 1e6 for gemma3_text, 10000 otherwise)");
  cmd->add_flag("--tie-word-embeddings", opts->tie_word_embeddings, "Share embed_tokens with the LM head");
  cmd->callback([opts, vocab] {
    if (*vocab > 0) opts->vocab_size = *vocab;
    Status st = models::init_model(*opts);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera: %s\n", st.to_string().c_str());
      exit_code() = 1;
      return;
    }
    std::printf("wrote %s\n", opts->out.c_str());
  });
}

}  // namespace tessera::app
