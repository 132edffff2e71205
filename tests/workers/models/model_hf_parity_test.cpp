// HF parity against transformers itself ($TESSERA_PYTHON, the venv deploy/dev.sh installs). One
// Python process builds a tiny random model per case, saves it with save_pretrained and computes
// logits for a left-padded batch: in fp32 (eager attention), in bf16 (sdpa, as verl runs it), and
// in fp32 through the KV cache (a 5-column prefill, then one column per call, as generate() runs).
// The cases:
//   qwen2          Qwen2ForCausalLM (q/k/v biases)
//   qwen3          Qwen3ForCausalLM: q_norm/k_norm, head_dim 32 != hidden / heads, tied embeddings
//   llama_llama3   LlamaForCausalLM, rope_scaling llama3 (Llama-3.1/3.2), written as Llama-3.x
//                  ships it (top-level rope_theta + rope_scaling)
//   llama_linear   rope_scaling linear, attention_bias (q/k/v and o_proj biases)
//   llama_dynamic  rope_scaling dynamic (NTK) with max_position_embeddings 8 under 12 columns, so
//                  the base is recomputed: per call from its own positions, which is why the
//                  KV-cache logits differ from the full forward's (and must match HF's)
//   llama_yarn     rope_scaling yarn (factor 4 over an original context of 64) written as Qwen2.5
//                  ships it ("type": "yarn" in rope_scaling), with beta_fast 0 and beta_slow null
//                  (transformers' `or` defaults: 32 and 1)
//   qwen2_yarn     yarn with every knob: beta_fast/slow, mscale and mscale_all_dim, no truncation
//   mistral        MistralForCausalLM, sliding_window 4 under 9 columns (and 6 generated tokens)
//   qwen3_moe      Qwen3MoeForCausalLM: 8 experts, top 2 renormalised (norm_topk_prob), head_dim 32,
//                  layer 1 dense (mlp_only_layers); saved per expert, config with num_local_experts
//   qwen2_moe      Qwen2MoeForCausalLM: 6 experts, top 3 not renormalised, a shared expert with its
//                  sigmoid gate, q/k/v biases (qkv_bias)
//   gemma2         Gemma2ForCausalLM: 3 layers (sliding, full, sliding; window 4), head_dim 32,
//                  query_pre_attn_scalar 24, attn/final logit softcaps 2 and 3 (small, so tanh
//                  bends), GeGLU, four (1 + w) norms per layer, scaled and tied embeddings; HF has
//                  no sdpa for it, so its bf16 logits come from eager attention
//   gemma3_text    Gemma3ForCausalLM: 3 layers (sliding, full, sliding; window 4), q_norm/k_norm in
//                  the (1 + w) form, the full layer's RoPE on base 1e6 with linear scaling 2, the
//                  sliding layers' on base 1e4 (rope_parameters per layer type, as transformers 5
//                  writes it), query_pre_attn_scalar 24, no softcaps
// Each case also records HF's greedy generate() (6 new tokens, fp32, eager, no EOS stop), which
// Tessera's KV-cache loop must reproduce token for token.
// Tessera loads each directory in the same dtype, on every device this process has (the CPU, and
// cuda:0 where a GPU is), and must match wherever attention_mask is 1: to 1e-5 in fp32, and in
// bf16 to within the rounding of bf16 logits. Skips when `import torch, transformers` fails; a
// script that fails after that import is a test failure.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "proto/device.hpp"
#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/models/model_io.hpp"

namespace tessera::models {
namespace {

// argv: the output root, then case names; writes <root>/<case>/{config.json, model.safetensors, case.json}.
const char* kScript = R"PY(
import json, os, sys, torch, transformers
assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__
PREFILL, GENERATE = 5, 6

def build(out, case):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-6)
    T, legacy = 9, None
    attn_bf16 = "sdpa"
    if case == "mistral":
        from transformers import MistralConfig as Config, MistralForCausalLM as Model
        cfg = Config(max_position_embeddings=256, rope_theta=10000.0, sliding_window=4, tie_word_embeddings=False,
                     **common)
    elif case == "gemma2":
        from transformers import Gemma2Config as Config, Gemma2ForCausalLM as Model
        cfg = Config(**dict(common, num_hidden_layers=3), head_dim=32, max_position_embeddings=256,
                     rope_theta=10000.0, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                     final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
        attn_bf16 = "eager"
    elif case == "gemma3_text":
        from transformers import Gemma3TextConfig as Config, Gemma3ForCausalLM as Model
        cfg = Config(**dict(common, num_hidden_layers=3), head_dim=32, max_position_embeddings=256,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=4,
                     rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                     query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    elif case == "qwen2":
        from transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
        cfg = Config(max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False, **common)
    elif case == "qwen2_yarn":
        from transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
        cfg = Config(max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False,
                     rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                                   "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0,
                                   "truncate": False}, **common)
    elif case == "qwen3_moe":
        from transformers import Qwen3MoeConfig as Config, Qwen3MoeForCausalLM as Model
        cfg = Config(**dict(common, num_hidden_layers=3), head_dim=32, max_position_embeddings=256,
                     rope_theta=1000000.0, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])
    elif case == "qwen2_moe":
        from transformers import Qwen2MoeConfig as Config, Qwen2MoeForCausalLM as Model
        cfg = Config(max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False, num_experts=6,
                     num_experts_per_tok=3, moe_intermediate_size=16, shared_expert_intermediate_size=40,
                     norm_topk_prob=False, **common)
    elif case == "qwen3":
        from transformers import Qwen3Config as Config, Qwen3ForCausalLM as Model
        cfg = Config(head_dim=32, max_position_embeddings=256, rope_theta=1000000.0, tie_word_embeddings=True,
                     use_sliding_window=False, sliding_window=None, **common)
    else:
        from transformers import LlamaConfig as Config, LlamaForCausalLM as Model
        kind = case.split("_")[1]
        scaling = {"llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64},
                   "linear": {"rope_type": "linear", "factor": 4.0},
                   "dynamic": {"rope_type": "dynamic", "factor": 2.0},
                   "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}[kind]
        T = 12 if kind == "dynamic" else 9
        cfg = Config(max_position_embeddings=8 if kind == "dynamic" else 256, rope_theta=10000.0,
                     rope_scaling=dict(scaling), attention_bias=kind == "linear", tie_word_embeddings=False, **common)
        if kind == "llama3":
            legacy = (10000.0, scaling)
        if kind == "yarn":
            legacy = (10000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 0,
                                "beta_slow": None})
    try:
        model = Model._from_config(cfg, attn_implementation="eager")
    except TypeError:
        model = Model(cfg)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)  # non-trivial norms and biases
    model.save_pretrained(out, safe_serialization=True)
    if legacy is not None:  # transformers >= 5 writes rope_parameters; Llama-3.x's hub config is older
        j = json.load(open(out + "/config.json"))
        j.pop("rope_parameters", None)
        j["rope_theta"], j["rope_scaling"] = legacy
        json.dump(j, open(out + "/config.json", "w"), indent=2)
    ids = torch.randint(3, 128, (3, T))
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    def load(dtype, attn):  # fresh from disk each time: dynamic RoPE keeps state across calls
        return Model.from_pretrained(out, dtype=dtype, attn_implementation=attn).eval()

    def stepwise(m):
        cache, pieces, t = None, [], 0
        while t < T:
            n = PREFILL if t == 0 else 1
            o = m(input_ids=ids[:, t:t + n], attention_mask=mask[:, :t + n], position_ids=pos[:, t:t + n],
                  past_key_values=cache, use_cache=True)
            cache, t = o.past_key_values, t + n
            pieces.append(o.logits.float())
        return torch.cat(pieces, 1)

    with torch.no_grad():
        logits = load(torch.float32, "eager")(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        logits_bf16 = load(torch.bfloat16, attn_bf16)(input_ids=ids, attention_mask=mask,
                                                      position_ids=pos).logits.float()
        logits_decode = stepwise(load(torch.float32, "eager"))
        g = load(torch.float32, "eager")
        g.generation_config.eos_token_id = None
        greedy = g.generate(input_ids=ids, attention_mask=mask, max_new_tokens=GENERATE, do_sample=False,
                            pad_token_id=0)[:, T:]
    json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "position_ids": pos.tolist(),
               "prefill": PREFILL, "logits": logits.tolist(), "logits_bf16": logits_bf16.tolist(),
               "logits_decode": logits_decode.tolist(), "greedy": greedy.tolist(),
               "transformers": transformers.__version__},
              open(out + "/case.json", "w"))

for case in sys.argv[2:]:
    build(os.path.join(sys.argv[1], case), case)
)PY";

const std::vector<std::string> kCases = {"qwen2",      "qwen3",   "llama_llama3", "llama_linear",
                                         "llama_dynamic", "mistral", "gemma2",       "llama_yarn",
                                         "qwen2_yarn", "qwen3_moe", "qwen2_moe", "gemma3_text"};

at::Tensor from_json(const nlohmann::json& j, at::ScalarType dtype) {
  std::vector<int64_t> shape;
  for (const nlohmann::json* p = &j; p->is_array(); p = &(*p)[0]) shape.push_back(static_cast<int64_t>(p->size()));
  std::vector<double> flat;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (!v.is_array()) return flat.push_back(v.get<double>());
    for (const auto& e : v) walk(e);
  };
  walk(j);
  return at::tensor(flat, at::kDouble).view(shape).to(dtype);
}

std::string python() {
  const char* p = std::getenv("TESSERA_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

struct HfCases {
  bool available = false;  ///< torch and transformers import.
  bool built = false;      ///< The script succeeded: root/<case> holds every case.
  std::string root;
};

// Builds every HF case once per test binary, in one Python process.
const HfCases& hf_cases() {
  static testing::TempDir dir;
  static const HfCases made = [] {
    HfCases c;
    c.root = dir.path();
    c.available = std::system((python() + " -c 'import torch, transformers' >/dev/null 2>&1").c_str()) == 0;
    if (!c.available) return c;
    std::ofstream(dir / "make.py") << kScript;
    std::string cmd = python() + " " + (dir / "make.py") + " " + dir.path();
    for (const std::string& name : kCases) cmd += " " + name;
    c.built = std::system(cmd.c_str()) == 0;
    return c;
  }();
  return made;
}

std::vector<std::string> devices() {
  std::vector<std::string> out{"cpu"};
  if (proto::cuda_device_count() > 0) out.push_back("cuda:0");
  return out;
}

class ModelHfParity : public ::testing::TestWithParam<std::string> {
 protected:
  // The case directory; empty (with the test skipped or failed) when it cannot be built.
  std::string case_dir() {
    const HfCases& cases = hf_cases();
    if (!cases.available) {
      skip_ = true;
      return "";
    }
    if (!cases.built) {
      ADD_FAILURE() << python() << " imports torch and transformers, but the case script failed (output above)";
      return "";
    }
    return cases.root + "/" + GetParam();
  }
  bool skip_ = false;
};

struct Loaded {
  std::shared_ptr<CausalLM> model;
  nlohmann::json expected;
  testing::Batch batch;  ///< On the model's device.
};

std::optional<Loaded> load_case(const std::string& dir, const std::string& device_name, c10::ScalarType dtype) {
  Loaded out;
  out.expected = nlohmann::json::parse(std::ifstream(dir + "/case.json"));
  const c10::Device device = *proto::parse_device(device_name);
  LoadOptions load;
  load.dtype = dtype;
  load.device = device;
  auto model = load_causal_lm(dir, load);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return std::nullopt;
  out.model = *model;
  const nlohmann::json& c = out.expected;
  out.batch = testing::Batch{from_json(c["input_ids"], at::kLong).to(device),
                             from_json(c["attention_mask"], at::kLong).to(device),
                             from_json(c["position_ids"], at::kLong).to(device)};
  return out;
}

void report(const std::string& what, const std::string& device_name, c10::ScalarType dtype, const Loaded& l,
            double diff, double tolerance) {
  std::printf("[hf parity %s %s %s, transformers %s] max |ours - HF| = %.3g (tolerance %.g)\n", what.c_str(),
              device_name.c_str(), c10::toString(dtype), l.expected["transformers"].get<std::string>().c_str(), diff,
              tolerance);
}

void expect_parity(const std::string& dir, const std::string& device_name, c10::ScalarType dtype, const char* key,
                   double tolerance) {
  std::optional<Loaded> l = load_case(dir, device_name, dtype);
  if (!l) return;
  const testing::Batch& b = l->batch;
  torch::NoGradGuard g;
  at::Tensor logits = l->model->forward(b.input_ids, b.attention_mask, b.position_ids).to(at::kCPU);
  EXPECT_TRUE(logits.isfinite().all().item<bool>()) << "left-padding positions must stay finite too";
  double diff = testing::masked_max_diff(logits, from_json(l->expected[key], at::kDouble), b.attention_mask.to(at::kCPU));
  report(key, device_name, dtype, *l, diff, tolerance);
  EXPECT_LT(diff, tolerance) << device_name;
}

// CausalLM::forward_step over the same columns as the script's stepwise(): a prefill, then one
// column per call, each call with its own position ids (what dynamic RoPE depends on).
void expect_decode_parity(const std::string& dir, const std::string& device_name, double tolerance) {
  std::optional<Loaded> l = load_case(dir, device_name, c10::ScalarType::Float);
  if (!l) return;
  const testing::Batch& b = l->batch;
  const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1), prefill = l->expected["prefill"].get<int64_t>();
  auto cache = KVCache::create(l->model->config(), {B, T, at::kFloat, b.input_ids.device()});
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  std::vector<at::Tensor> pieces;
  for (int64_t start = 0; start < T;) {
    const int64_t n = start == 0 ? prefill : 1;
    pieces.push_back(l->model->forward_step(b.input_ids.narrow(1, start, n), b.position_ids.narrow(1, start, n),
                                            *cache, b.attention_mask));  // only the first start + n columns count
    start += n;
  }
  at::Tensor logits = at::cat(pieces, 1).to(at::kCPU);
  double diff = testing::masked_max_diff(logits, from_json(l->expected["logits_decode"], at::kDouble),
                                         b.attention_mask.to(at::kCPU));
  report("kv-cache decode", device_name, c10::ScalarType::Float, *l, diff, tolerance);
  EXPECT_LT(diff, tolerance) << device_name;
}

// Greedy decoding through the KV cache: prefill the whole left-padded batch, then feed back each
// argmax with the next position; the tokens must be HF generate()'s.
void expect_greedy_parity(const std::string& dir, const std::string& device_name) {
  std::optional<Loaded> l = load_case(dir, device_name, c10::ScalarType::Float);
  if (!l) return;
  const testing::Batch& b = l->batch;
  at::Tensor expected = from_json(l->expected["greedy"], at::kLong);
  const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1), steps = expected.size(1);
  auto cache = KVCache::create(l->model->config(), {B, T + steps, at::kFloat, b.input_ids.device()});
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  at::Tensor mask = at::cat({b.attention_mask, at::ones({B, steps}, b.attention_mask.options())}, 1);
  at::Tensor logits = l->model->forward_step(b.input_ids, b.position_ids, *cache, mask);
  at::Tensor pos = b.position_ids.narrow(1, T - 1, 1);
  std::vector<at::Tensor> tokens;
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor next = logits.select(1, logits.size(1) - 1).argmax(-1, /*keepdim=*/true);  // [B, 1]
    tokens.push_back(next);
    pos = pos + 1;
    if (s + 1 < steps) logits = l->model->forward_step(next, pos, *cache, mask);
  }
  at::Tensor got = at::cat(tokens, 1).to(at::kCPU);
  std::printf("[hf parity greedy %s] %ld tokens x %ld rows identical: %s\n", device_name.c_str(), steps, B,
              at::equal(got, expected) ? "yes" : "no");
  EXPECT_TRUE(at::equal(got, expected)) << device_name << "\nours " << got << "\nHF " << expected;
}

TEST_P(ModelHfParity, MatchesTransformersInFp32) {
  const std::string dir = case_dir();
  if (skip_) GTEST_SKIP() << python() << " with torch and transformers is not available";
  if (dir.empty()) return;
  // TF32 off: cuda must match fp32 HF bit for bit up to summation order.
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const std::string& d : devices()) expect_parity(dir, d, c10::ScalarType::Float, "logits", 1e-5);
}

TEST_P(ModelHfParity, MatchesTransformersInBf16) {
  const std::string dir = case_dir();
  if (skip_) GTEST_SKIP() << python() << " with torch and transformers is not available";
  if (dir.empty()) return;
  // bf16 logits of magnitude ~1 carry ~4e-3 of rounding each; two implementations that round
  // intermediate sums differently stay within a few of those.
  for (const std::string& d : devices()) expect_parity(dir, d, c10::ScalarType::BFloat16, "logits_bf16", 3e-2);
}

TEST_P(ModelHfParity, KvCacheDecodeMatchesTransformersInFp32) {
  const std::string dir = case_dir();
  if (skip_) GTEST_SKIP() << python() << " with torch and transformers is not available";
  if (dir.empty()) return;
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const std::string& d : devices()) expect_decode_parity(dir, d, 1e-5);
}

TEST_P(ModelHfParity, GreedyGenerationMatchesTransformers) {
  const std::string dir = case_dir();
  if (skip_) GTEST_SKIP() << python() << " with torch and transformers is not available";
  if (dir.empty()) return;
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const std::string& d : devices()) expect_greedy_parity(dir, d);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelHfParity, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tessera::models
