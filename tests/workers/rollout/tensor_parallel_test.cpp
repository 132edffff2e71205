// Rollout TP slicing (tensor_parallel.hpp) against direct slicing of the full tensors: the slices a
// TP rank assembles from FSDP shards (any shard count, padding included) equal narrow() of the
// full parameters; per-rank model shapes; verl's all-gather of the prompts within a TP group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/runtime/collective/collective_test_util.hpp"
#include "workers/rollout/tensor_parallel.hpp"

namespace tessera::rollout {
namespace {

// A decoder layer unit (Qwen2: q/k/v biases), in the FSDP wrapping's parameter order.
std::vector<std::pair<std::string, std::vector<int64_t>>> layer_params() {
  const std::string p = "model.layers.0.";
  return {{p + "self_attn.q_proj.weight", {8, 6}}, {p + "self_attn.q_proj.bias", {8}},
          {p + "self_attn.k_proj.weight", {4, 6}}, {p + "self_attn.k_proj.bias", {4}},
          {p + "self_attn.v_proj.weight", {4, 6}}, {p + "self_attn.v_proj.bias", {4}},
          {p + "self_attn.o_proj.weight", {6, 8}}, {p + "mlp.gate_proj.weight", {10, 6}},
          {p + "mlp.up_proj.weight", {10, 6}},     {p + "mlp.down_proj.weight", {6, 10}},
          {p + "input_layernorm.weight", {6}},     {p + "post_attention_layernorm.weight", {6}}};
}

// A Qwen2-MoE layer unit: 3 experts stacked [E, out, in], the router, a shared expert and its gate.
std::vector<std::pair<std::string, std::vector<int64_t>>> moe_layer_params() {
  const std::string p = "model.layers.1.";
  return {{p + "self_attn.q_proj.weight", {8, 6}},          {p + "self_attn.o_proj.weight", {6, 8}},
          {p + "mlp.experts.gate_proj", {3, 4, 6}},         {p + "mlp.experts.up_proj", {3, 4, 6}},
          {p + "mlp.experts.down_proj", {3, 6, 4}},         {p + "mlp.gate.weight", {3, 6}},
          {p + "mlp.shared_expert.gate_proj.weight", {10, 6}}, {p + "mlp.shared_expert.up_proj.weight", {10, 6}},
          {p + "mlp.shared_expert.down_proj.weight", {6, 10}}, {p + "mlp.shared_expert_gate.weight", {1, 6}},
          {p + "input_layernorm.weight", {6}}};
}

TEST(TpSplit, FollowsMegatronRowAndColumnParallelLayers) {
  EXPECT_EQ(tp_split_of("model.layers.3.self_attn.k_proj.bias"), TpSplit::rows);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.up_proj.weight"), TpSplit::rows);
  EXPECT_EQ(tp_split_of("model.layers.3.self_attn.o_proj.weight"), TpSplit::columns);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.down_proj.weight"), TpSplit::columns);
  // MoE: every expert split like the dense MLP; the router and the shared expert's gate whole.
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.experts.gate_proj"), TpSplit::rows);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.experts.up_proj"), TpSplit::rows);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.experts.down_proj"), TpSplit::columns);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.shared_expert.up_proj.weight"), TpSplit::rows);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.shared_expert.down_proj.weight"), TpSplit::columns);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.gate.weight"), TpSplit::replicated);
  EXPECT_EQ(tp_split_of("model.layers.3.mlp.shared_expert_gate.weight"), TpSplit::replicated);
  const at::Tensor experts = at::arange(3 * 4 * 6).view({3, 4, 6});
  EXPECT_TRUE(at::equal(tp_slice(experts, TpSplit::rows, 2, 1), experts.narrow(1, 2, 2)));
  EXPECT_TRUE(at::equal(tp_slice(experts, TpSplit::columns, 2, 1), experts.narrow(2, 3, 3)));
  // Qwen3's q_norm/k_norm act on head_dim within each head and o_proj's bias is added after the
  // all-reduce: whole on every rank.
  for (const char* n : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                        "model.layers.3.input_layernorm.weight", "model.layers.3.self_attn.q_norm.weight",
                        "model.layers.3.self_attn.k_norm.weight", "model.layers.3.self_attn.o_proj.bias"}) {
    EXPECT_EQ(tp_split_of(n), TpSplit::replicated) << n;
  }
}

TEST(TpRankConfig, DividesHeadsAndWidthsAndNamesWhatDoesNotDivide) {
  models::ModelConfig c;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 48;
  auto two = tp_rank_config(c, 2);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(two->num_attention_heads, 2);
  EXPECT_EQ(two->num_key_value_heads, 1);
  EXPECT_EQ(two->intermediate_size, 24);
  EXPECT_EQ(two->head_dim, 8);
  EXPECT_EQ(two->hidden_size, 32);
  auto four = tp_rank_config(c, 4);
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.status().message().find("num_key_value_heads = 2"), std::string::npos) << four.status().to_string();
  EXPECT_NE(four.status().message().find("tensor_model_parallel_size=4"), std::string::npos);

  c.moe.num_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.moe_intermediate_size = 32;
  c.moe.shared_expert_intermediate_size = 24;
  auto moe = tp_rank_config(c, 2);
  ASSERT_TRUE(moe.ok()) << moe.status().to_string();
  EXPECT_EQ(moe->moe.moe_intermediate_size, 16);
  EXPECT_EQ(moe->moe.shared_expert_intermediate_size, 12);
  EXPECT_EQ(moe->moe.num_experts, 4);
  c.moe.moe_intermediate_size = 24;  // 12 per rank: not a multiple of 8 (grouped GEMM rows)
  auto odd = tp_rank_config(c, 2);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("moe_intermediate_size = 24"), std::string::npos) << odd.status().to_string();
  // Every layer sparse: intermediate_size (the dense MLP's) is nobody's and need not divide.
  c.moe.moe_intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.intermediate_size = 45;
  EXPECT_TRUE(tp_rank_config(c, 2).ok());
  c.moe.mlp_only_layers = {1};
  auto dense = tp_rank_config(c, 2);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("intermediate_size = 45"), std::string::npos) << dense.status().to_string();
}

// For K shards of the unit's padded flat buffer, rank t's buffer assembled shard by shard (each
// shard's pack() placed at [count_before(s0), count_before(s1))) holds exactly tp_slice() of every
// full parameter.
TEST(TpUnitPlan, SlicesAssembledFromAnyShardingEqualTheFullTensorsSlices) {
  for (int K : {1, 2, 3, 4, 7})
  for (bool moe : {false, true}) {
    auto layout = fsdp::make_flat_layout(moe ? "model.layers.1" : "model.layers.0",
                                         moe ? moe_layer_params() : layer_params(), K);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    at::Tensor flat = at::arange(layout->padded_numel, at::kFloat);
    for (int64_t tp : {1, 2}) {
      for (int64_t t = 0; t < tp; ++t) {
        SCOPED_TRACE(::testing::Message() << "K=" << K << " tp=" << tp << " rank=" << t << " moe=" << moe);
        auto plan = TpUnitPlan::create(*layout, tp, t);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        at::Tensor buffer = at::full({plan->numel()}, -1.0f);
        for (int k = 0; k < K; ++k) {
          const auto [s0, s1] = layout->shard_range(k);
          const int64_t lo = plan->count_before(s0), hi = plan->count_before(s1);
          at::Tensor packed = plan->pack(flat.narrow(0, s0, s1 - s0), s0);
          ASSERT_EQ(packed.numel(), hi - lo);
          buffer.narrow(0, lo, hi - lo).copy_(packed);
        }
        EXPECT_EQ(plan->count_before(layout->padded_numel), plan->numel());
        ASSERT_EQ(plan->params().size(), layout->params.size());
        for (const auto& e : layout->params) {
          const at::Tensor full = flat.narrow(0, e.offset, e.numel).view(e.shape);
          const at::Tensor want = tp_slice(full, tp_split_of(e.name), tp, t);
          auto it = std::find_if(plan->params().begin(), plan->params().end(), [&](const auto& p) { return p.name == e.name; });
          ASSERT_NE(it, plan->params().end()) << e.name;
          ASSERT_EQ(at::IntArrayRef(it->shape), want.sizes()) << e.name;
          EXPECT_TRUE(at::equal(buffer.narrow(0, it->offset, want.numel()).view(want.sizes()), want)) << e.name;
        }
      }
    }
  }
}

TEST(TpUnitPlan, RefusesASplitTheWidthsDoNotAllow) {
  auto layout = fsdp::make_flat_layout("model.layers.0", layer_params(), 2);
  ASSERT_TRUE(layout.ok());
  auto plan = TpUnitPlan::create(*layout, 3, 0);  // 8 q rows are not divisible by 3
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("q_proj.weight"), std::string::npos) << plan.status().to_string();
}

TEST(AllGatherDataProto, EveryPeerGetsAllRowsInRankOrderWithOffsets) {
  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& comm) {
    const int64_t rows = rank == 0 ? 3 : 2;  // uneven on purpose
    at::Tensor ids = at::arange(rows * 4, at::kLong).view({rows, 4}) + rank * 100;
    std::vector<std::string> tags;
    for (int64_t i = 0; i < rows; ++i) tags.push_back("r" + std::to_string(rank) + "_" + std::to_string(i));
    auto data = proto::DataProto::from_dict(proto::TensorDict{{"input_ids", ids}}, {{"tag", proto::Column::strings(tags)}},
                                            nlohmann::json{{"rank", rank}});
    ASSERT_TRUE(data.ok()) << data.status().to_string();
    std::vector<int64_t> offsets;
    auto all = all_gather_data_proto(comm, *data, offsets);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3, 5}));
    at::Tensor want = at::cat({at::arange(12, at::kLong).view({3, 4}), at::arange(8, at::kLong).view({2, 4}) + 100});
    EXPECT_TRUE(at::equal(*all->tensor("input_ids"), want));
    EXPECT_EQ(all->meta_info().at("rank"), rank);  // each peer keeps its own meta_info
    auto back = all->slice(offsets[rank], offsets[rank + 1]);
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(at::equal(*back->tensor("input_ids"), ids));
    auto tag = all->column("tag");
    ASSERT_TRUE(tag.ok()) << tag.status().to_string();
    EXPECT_EQ(tag->size(), 5);
  });
}

// A worker on a GPU holds its prompts on its device: they cross as host frames and the gathered
// batch is back on the device (the frame codec takes host tensors only).
TEST(AllGatherDataProto, OnCudaRowsOnTheDeviceComeBackOnIt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& comm) {
    const int64_t rows = rank == 0 ? 3 : 2;
    at::Tensor ids = at::arange(rows * 4, at::kLong).view({rows, 4}) + rank * 100;
    auto data = proto::DataProto::from_dict(proto::TensorDict{{"input_ids", ids.to(cuda)}}, {}, nlohmann::json::object());
    ASSERT_TRUE(data.ok()) << data.status().to_string();
    std::vector<int64_t> offsets;
    auto all = all_gather_data_proto(comm, *data, offsets);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    EXPECT_EQ(all->tensor("input_ids")->device(), cuda);
    at::Tensor want = at::cat({at::arange(12, at::kLong).view({3, 4}), at::arange(8, at::kLong).view({2, 4}) + 100});
    EXPECT_TRUE(at::equal(all->tensor("input_ids")->cpu(), want));
  });
}

}  // namespace
}  // namespace tessera::rollout
