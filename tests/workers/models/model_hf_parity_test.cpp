// HF parity against transformers itself ($TESSERA_PYTHON, the venv deploy/dev.sh installs). Python
// builds a tiny random Qwen2ForCausalLM, saves it with save_pretrained and computes logits for a
// left-padded batch, in fp32 (eager attention) and in bf16 (sdpa, as verl runs it); Tessera loads
// the directory in the same dtype, on every device this process has (the CPU, and cuda:0 where a
// GPU is), and must match wherever attention_mask is 1: to 1e-5 in fp32, and in bf16 to within
// the rounding of bf16 logits. Skips when `import torch, transformers` fails.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "proto/device.hpp"
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
    bf16 = Qwen2ForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    logits_bf16 = bf16(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
json.dump({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "position_ids": pos.tolist(),
           "logits": logits.tolist(), "logits_bf16": logits_bf16.tolist(),
           "transformers": transformers.__version__}, open(out + "/case.json", "w"))
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

std::string python() {
  const char* p = std::getenv("TESSERA_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

// Builds the HF case once per test binary; empty when Python or transformers is missing.
const std::string& hf_case_dir() {
  static testing::TempDir dir;
  static const std::string made = [] {
    if (std::system((python() + " -c 'import torch, transformers' >/dev/null 2>&1").c_str()) != 0) return std::string();
    std::ofstream(dir / "make.py") << kScript;
    const std::string cmd = python() + " " + (dir / "make.py") + " " + (dir / "model");
    return std::system(cmd.c_str()) == 0 ? dir / "model" : std::string();
  }();
  return made;
}

std::vector<std::string> devices() {
  std::vector<std::string> out{"cpu"};
  if (proto::cuda_device_count() > 0) out.push_back("cuda:0");
  return out;
}

void expect_parity(const std::string& device_name, c10::ScalarType dtype, const char* key, double tolerance) {
  const std::string& dir = hf_case_dir();
  if (dir.empty()) GTEST_SKIP() << python() << " with torch and transformers is not available";
  nlohmann::json c = nlohmann::json::parse(std::ifstream(dir + "/case.json"));
  const c10::Device device = *proto::parse_device(device_name);
  LoadOptions load;
  load.dtype = dtype;
  load.device = device;
  auto model = load_causal_lm(dir, load);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  testing::Batch b{from_json(c["input_ids"], at::kLong).to(device), from_json(c["attention_mask"], at::kLong).to(device),
                   from_json(c["position_ids"], at::kLong).to(device)};
  torch::NoGradGuard g;
  at::Tensor logits = (*model)->forward(b.input_ids, b.attention_mask, b.position_ids).to(at::kCPU);
  EXPECT_TRUE(logits.isfinite().all().item<bool>()) << "left-padding positions must stay finite too";
  double diff = testing::masked_max_diff(logits, from_json(c[key], at::kDouble), b.attention_mask.to(at::kCPU));
  std::printf("[hf parity %s %s, transformers %s] max |ours - HF| = %.3g (tolerance %.g)\n", device_name.c_str(),
              c10::toString(dtype), c["transformers"].get<std::string>().c_str(), diff, tolerance);
  EXPECT_LT(diff, tolerance) << device_name;
}

TEST(ModelHfParity, Qwen2MatchesTransformersInFp32) {
  // TF32 off: cuda must match fp32 HF bit for bit up to summation order.
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const std::string& d : devices()) expect_parity(d, c10::ScalarType::Float, "logits", 1e-5);
}

TEST(ModelHfParity, Qwen2MatchesTransformersInBf16) {
  // bf16 logits of magnitude ~1 carry ~4e-3 of rounding each; two implementations that round
  // intermediate sums differently stay within a few of those.
  for (const std::string& d : devices()) expect_parity(d, c10::ScalarType::BFloat16, "logits_bf16", 3e-2);
}

}  // namespace
}  // namespace tessera::models
