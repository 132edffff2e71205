// HF parity (label gpu: it needs Python with torch>=2 and transformers, which only the GPU image
// has). Python builds a tiny random Qwen2ForCausalLM, saves it with save_pretrained and computes
// logits for a left-padded batch; Tessera loads the directory and must match to within 1e-5
// wherever attention_mask is 1. Skips when `import torch, transformers` fails.
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model_io.hpp"

namespace tessera::models {
namespace {

const char* kScript = R"PY(
import json, sys, torch, transformers
from transformers import Qwen2Config, Qwen2ForCausalLM
out = sys.argv[1]
assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
try:
    model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager")
except TypeError:
    model = Qwen2ForCausalLM(cfg)
model = model.float().eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        p.add_(torch.randn_like(p) * 0.05)  # non-trivial norms and biases
model.save_pretrained(out, safe_serialization=True)
ids = torch.randint(3, 128, (3, 9))
mask = torch.ones(3, 9, dtype=torch.long)
mask[1, :4] = 0
mask[2, :7] = 0
ids = ids.masked_fill(mask == 0, 0)
pos = (mask.cumsum(-1) - 1).clamp(min=0)
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "position_ids": pos.tolist(),
           "logits": logits.tolist(), "transformers": transformers.__version__}, open(out + "/case.json", "w"))
)PY";

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

TEST(ModelHfParity, Qwen2MatchesTransformers) {
  if (std::system("python3 -c 'import torch, transformers' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with torch and transformers is not available";
  }
  testing::TempDir dir;
  std::ofstream(dir / "make.py") << kScript;
  std::string cmd = "python3 " + (dir / "make.py") + " " + (dir / "model");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "model/case.json"));
  auto model = load_causal_lm(dir / "model");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  testing::Batch b{from_json(c["input_ids"], at::kLong), from_json(c["attention_mask"], at::kLong),
                   from_json(c["position_ids"], at::kLong)};
  torch::NoGradGuard g;
  at::Tensor logits = (*model)->forward(b.input_ids, b.attention_mask, b.position_ids);
  double diff = testing::masked_max_diff(logits, from_json(c["logits"], at::kDouble), b.attention_mask);
  std::printf("[hf parity, transformers %s] max |ours - HF| = %.3g (tolerance 1e-5)\n",
              c["transformers"].get<std::string>().c_str(), diff);
  EXPECT_LT(diff, 1e-5);
}

}  // namespace
}  // namespace tessera::models
