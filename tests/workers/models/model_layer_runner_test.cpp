// DecoderBackbone's layer runner (the hook FSDP uses to free each layer after its forward): it
// sees every layer once, in order, with the layer's input; returning call(h) gives exactly the
// direct forward (logits and gradients bitwise); the call is re-runnable with identical results
// (what a recompute in backward relies on) after the forward has returned; KV-cache decoding
// bypasses it; and an exception from the runner leaves forward.
#include <stdexcept>
#include <vector>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/kv_cache.hpp"

namespace tessera::models {
namespace {

using testing::left_padded_batch;
using testing::randomise;
using testing::tiny_config;

std::shared_ptr<CausalLM> make_lm(const std::string& type) {
  auto m = CausalLM::create(tiny_config(type, /*kv_heads=*/2));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  randomise(**m, 77);
  return *m;
}

std::map<std::string, at::Tensor> grads_of(CausalLM& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().grad().clone();
  return out;
}

TEST(LayerRunner, PassThroughEqualsDirectForwardBitwise) {
  for (const std::string type : {"llama", "qwen2"}) {
    auto m = make_lm(type);
    auto b = left_padded_batch({5, 3, 6}, 6, 64, 3);
    at::Tensor want = m->forward(b.input_ids, b.attention_mask, b.position_ids);
    want.pow(2).mean().backward();
    auto want_grads = grads_of(*m);
    m->zero_grad();

    std::vector<int64_t> seen;
    m->backbone().set_layer_runner([&](int64_t i, LayerCall call, const at::Tensor& h) {
      seen.push_back(i);
      EXPECT_EQ(h.sizes(), (std::vector<int64_t>{3, 6, 32}));
      return call(h);
    });
    at::Tensor got = m->forward(b.input_ids, b.attention_mask, b.position_ids);
    got.pow(2).mean().backward();
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1})) << type;
    EXPECT_TRUE(at::equal(got, want)) << type;
    for (const auto& [name, g] : grads_of(*m)) EXPECT_TRUE(at::equal(g, want_grads.at(name))) << type << " " << name;
  }
}

TEST(LayerRunner, KeptCallRecomputesExactlyAfterForward) {
  auto m = make_lm("qwen2");
  auto b = left_padded_batch({4, 6}, 6, 64, 9);
  std::vector<LayerCall> kept;
  std::vector<at::Tensor> inputs, outputs;
  m->backbone().set_layer_runner([&](int64_t, LayerCall call, const at::Tensor& h) {
    at::Tensor out = call(h);
    kept.push_back(std::move(call));
    inputs.push_back(h.detach().clone());
    outputs.push_back(out.detach().clone());
    return out;
  });
  m->forward(b.input_ids, b.attention_mask, b.position_ids);
  ASSERT_EQ(kept.size(), 2u);
  // The forward's rotary tables and visibility are gone from its stack; the kept calls own theirs.
  for (size_t i = 0; i < kept.size(); ++i) {
    at::Tensor again = kept[i](inputs[i]);
    EXPECT_TRUE(at::equal(again, outputs[i])) << "layer " << i;
    // And with autograd (as a recompute in backward runs it): gradients reach the layer's weights.
    at::Tensor x = inputs[i].clone().requires_grad_(true);
    kept[i](x).sum().backward();
    EXPECT_TRUE(x.grad().defined());
  }
  EXPECT_TRUE(m->backbone().layers[0]->mlp->down_proj->weight.grad().defined());
}

TEST(LayerRunner, KvCacheDecodingBypassesTheRunner) {
  auto m = make_lm("llama");
  auto b = left_padded_batch({4}, 4, 64, 5);
  auto cache = KVCache::create(m->config(), {1, 8});
  ASSERT_TRUE(cache.ok());
  at::Tensor want = m->forward_step(b.input_ids, b.position_ids, *cache, b.attention_mask);
  int calls = 0;
  m->backbone().set_layer_runner([&](int64_t, LayerCall call, const at::Tensor& h) {
    ++calls;
    return call(h);
  });
  auto cache2 = KVCache::create(m->config(), {1, 8});
  ASSERT_TRUE(cache2.ok());
  at::Tensor got = m->forward_step(b.input_ids, b.position_ids, *cache2, b.attention_mask);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(at::equal(got, want));
  m->backbone().set_layer_runner(nullptr);
  EXPECT_FALSE(m->backbone().layer_runner());
}

TEST(LayerRunner, RunnerExceptionLeavesForward) {
  auto m = make_lm("llama");
  auto b = left_padded_batch({3}, 3, 64, 1);
  m->backbone().set_layer_runner([](int64_t i, LayerCall, const at::Tensor&) -> at::Tensor {
    throw std::runtime_error("layer " + std::to_string(i) + " refused");
  });
  try {
    m->forward(b.input_ids, b.attention_mask, b.position_ids);
    FAIL() << "forward did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "layer 0 refused");
  }
}

}  // namespace
}  // namespace tessera::models
