// init_model.cpp: stage a tokenizer, derive the config from it, initialise, save, rename.
#include "workers/models/init_model.hpp"

#include <filesystem>

#include "workers/models/config.hpp"
#include "proto/atomic_file.hpp"
#include "workers/models/model.hpp"
#include "workers/models/model_io.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;

// Files of an HF tokenizer directory that travel with it (tokenizer.json is required).
const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                       "special_tokens_map.json"};

Status copy_tokenizer(const std::string& src, const fs::path& dst) {
  if (!fs::exists(fs::path(src) / "tokenizer.json")) {
    return make_error(ErrorCode::not_found, "--tokenizer {}: no tokenizer.json there (expected bytes, chars:ALPHABET "
                      "or a directory holding tokenizer.json)", src);
  }
  std::error_code ec;
  fs::create_directories(dst, ec);
  for (const char* name : kTokenizerFiles) {
    fs::path from = fs::path(src) / name;
    if (!fs::exists(from)) continue;
    fs::copy_file(from, dst / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::io_error, "{}: cannot copy: {}", from.string(), ec.message());
  }
  return Status();
}

Status stage_tokenizer(const InitModelOptions& o, const fs::path& dir) {
  tokenizer::TokenizerSpec spec;
  spec.model_max_length = o.max_position;
  if (o.tokenizer == "bytes") {
    spec.kind = tokenizer::TokenizerSpec::Kind::byte;
  } else if (o.tokenizer.rfind("chars:", 0) == 0) {
    spec.kind = tokenizer::TokenizerSpec::Kind::chars;
    spec.alphabet = o.tokenizer.substr(6);
  } else {
    return copy_tokenizer(o.tokenizer, dir);
  }
  return tokenizer::write_tokenizer_files(spec, dir);
}

int64_t default_intermediate(int64_t hidden) { return ((8 * hidden / 3) + 63) / 64 * 64; }

// Mistral's window, and the Gemmas' fixed choices (init_model.hpp).
Status set_family_defaults(const InitModelOptions& o, ModelConfig& c) {
  if (o.sliding_window < 0) return make_error(ErrorCode::invalid_argument, "init-model: --sliding-window must not be negative");
  const bool gemma = o.arch == "gemma2" || o.arch == "gemma3_text";
  if (o.sliding_window > 0 && o.arch != "mistral" && !gemma) {
    return make_error(ErrorCode::invalid_argument, "init-model: --sliding-window is for --arch mistral, gemma2 or gemma3_text");
  }
  if (o.sliding_window > 0) c.sliding_window = o.sliding_window;
  // The Gemmas' layer types name sliding layers; HF's default window (4096) when none is given
  // (transformers cannot run sliding layers without one).
  if (gemma && !c.sliding_window) c.sliding_window = 4096;
  const bool moe = o.arch == "qwen3_moe" || o.arch == "qwen2_moe";
  if (!moe && (o.experts != 0 || o.experts_per_tok != 0 || o.moe_intermediate != 0 || o.norm_topk_prob)) {
    return make_error(ErrorCode::invalid_argument, "init-model: --experts and the MoE options are for --arch qwen3_moe or qwen2_moe");
  }
  if (o.shared_expert_intermediate != 0 && o.arch != "qwen2_moe") {
    return make_error(ErrorCode::invalid_argument, "init-model: --shared-expert-intermediate is for --arch qwen2_moe");
  }
  if (moe) {
    const bool qwen3 = o.arch == "qwen3_moe";
    MoeConfig& m = c.moe;
    m.num_experts = o.experts > 0 ? o.experts : (qwen3 ? 128 : 60);
    m.num_experts_per_tok = o.experts_per_tok > 0 ? o.experts_per_tok : (qwen3 ? 8 : 4);
    m.moe_intermediate_size = o.moe_intermediate > 0 ? o.moe_intermediate : (qwen3 ? 768 : 1408);
    m.norm_topk_prob = o.norm_topk_prob;
    if (!qwen3) {
      m.shared_expert_intermediate_size =
          o.shared_expert_intermediate > 0 ? o.shared_expert_intermediate : 4 * m.moe_intermediate_size;
    }
  }
  if (!gemma) return Status();
  c.hidden_act = "gelu_pytorch_tanh";
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = static_cast<double>(c.head_dim);
  if (o.arch == "gemma2") {
    c.attn_logit_softcapping = 50.0;
    c.final_logit_softcapping = 30.0;
    return Status();
  }
  // Gemma3TextConfig: no softcaps, every 6th layer full, the sliding layers' RoPE base 10000.
  c.rope_local_theta = 10000.0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_types.emplace_back((i + 1) % 6 != 0 ? "sliding_attention" : "full_attention");
  }
  return Status();
}

Result<ModelConfig> make_config(const InitModelOptions& o, const tokenizer::Tokenizer& tok) {
  ModelConfig c;
  c.model_type = o.arch;
  c.hidden_size = o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  c.intermediate_size = o.intermediate > 0 ? o.intermediate : default_intermediate(o.hidden);
  c.head_dim = o.head_dim > 0 ? o.head_dim : (o.heads > 0 ? o.hidden / o.heads : 0);
  if (o.head_dim <= 0 && o.heads > 0 && o.hidden % o.heads != 0) {
    return make_error(ErrorCode::invalid_argument, "init-model: --hidden {} is not divisible by --heads {}", o.hidden,
                      o.heads);
  }
  c.vocab_size = o.vocab_size.value_or(tok.vocab_size());
  if (c.vocab_size < tok.vocab_size()) {
    return make_error(ErrorCode::invalid_argument, "init-model: --vocab-size {} is smaller than the tokenizer's {}",
                      c.vocab_size, tok.vocab_size());
  }
  c.max_position_embeddings = o.max_position;
  c.tie_word_embeddings = o.tie_word_embeddings;
  c.attention_bias = o.arch == "qwen2" || o.arch == "qwen2_moe";
  TESSERA_RETURN_IF_ERROR(set_family_defaults(o, c));
  c.rope_theta = o.rope_theta.value_or(o.arch == "gemma3_text" ? 1e6 : 10000.0);
  c.rms_norm_eps = o.rms_norm_eps;
  if (auto id = tok.bos_token_id()) c.bos_token_id = *id;
  if (auto id = tok.eos_token_id()) c.eos_token_ids = {*id};
  if (auto id = tok.pad_token_id()) c.pad_token_id = *id;
  TESSERA_RETURN_IF_ERROR(architecture_name(o.arch, HeadKind::causal_lm).status().with_context("init-model --arch"));
  TESSERA_RETURN_IF_ERROR(validate_model_config(c, "init-model"));
  return c;
}

Status build_into(const InitModelOptions& o, const fs::path& staging) {
  TESSERA_RETURN_IF_ERROR(stage_tokenizer(o, staging));
  TESSERA_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_dir(staging));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, make_config(o, tok));
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, parse_torch_dtype(o.dtype));
  TESSERA_ASSIGN_OR_RETURN(auto model, CausalLM::create(config, ModelInit{dtype, o.seed}));
  return save_pretrained(*model, staging.string());
}

Status publish(const fs::path& staging, const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out)) fs::remove(out, ec);  // only an empty directory (checked before staging)
  fs::rename(staging, out, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: cannot rename {} into place: {}", out.string(), staging.string(), ec.message());
  return Status();
}

}  // namespace

Status init_model(const InitModelOptions& o) {
  if (o.out.empty()) return make_error(ErrorCode::invalid_argument, "init-model: --out is required");
  fs::path out = fs::path(o.out);
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"
  std::error_code ec;
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out, ec))) {
    return make_error(ErrorCode::already_exists, "init-model: {} already exists and is not an empty directory", out.string());
  }
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), ec);
  fs::path staging = proto::unique_temp_path(out.string());
  Status st;
  try {
    st = build_into(o, staging);
  } catch (const std::exception& e) {
    st = make_error(ErrorCode::internal, "init-model: {}", e.what());
  }
  if (st.ok()) st = publish(staging, out);
  if (!st.ok()) fs::remove_all(staging, ec);
  return st;
}

}  // namespace tessera::models
