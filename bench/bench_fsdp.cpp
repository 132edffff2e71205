// bench_fsdp: one FULL_SHARD training step (forward with per-layer recompute, backward with
// reduce-scatter, AdamW on shards) with 2 ranks over Gloo, next to one single-process step
// (plain LibTorch + torch::optim::AdamW) on the same model and the same global batch.
//
// The benchmark process is rank 0; it forks and re-executes itself as rank 1 (environment
// TESSERA_BENCH_FSDP_PEER=<port>, stdout to /dev/null). Before each FSDP step rank 0 broadcasts a
// command so the peer runs the same step; the command costs one 16-byte broadcast. Each rank
// uses one intra-op thread (2 ranks on 2 cores); the single-process step uses two.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>

#include "bench/bench_peer.hpp"
#include "runtime/collective/communicator.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/units.hpp"

namespace {

using namespace tessera;
constexpr const char* kPeerEnv = "TESSERA_BENCH_FSDP_PEER";
constexpr int64_t kVocab = 512, kDim = 256, kHidden = 1024, kLayers = 4, kBatch = 16, kSeq = 64;

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
  }
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Block);

struct BenchLM : torch::nn::Module {
  BenchLM() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < kLayers; ++i) {
      blocks.push_back(Block());
      layers->push_back(blocks.back());
    }
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<Block> blocks;
  torch::nn::Linear head{nullptr};
};

std::shared_ptr<BenchLM> make_model() {
  auto m = std::make_shared<BenchLM>();
  at::Generator gen = at::detail::createCPUGenerator(1);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.02);
  return m;
}

at::Tensor batch_tokens() {
  at::Generator gen = at::detail::createCPUGenerator(2);
  return at::randint(kVocab, {kBatch, kSeq + 1}, gen, at::kLong);
}

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape(-1));
}

fsdp::OptimizerOptions optim() {
  fsdp::OptimizerOptions o;
  o.adamw.lr = 1e-4;
  return o;
}

struct Rank {
  std::shared_ptr<collective::Communicator> world;
  std::unique_ptr<fsdp::FsdpModule> engine;
  std::shared_ptr<BenchLM> model;
};

Rank make_rank(int rank, int port) {
  collective::CommunicatorOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.master_port = port;
  o.gloo_hostname = "127.0.0.1";
  o.timeout = std::chrono::milliseconds(120000);
  Rank r;
  auto world = collective::make_communicator(o);
  if (!world.ok()) {
    std::fprintf(stderr, "bench_fsdp rank %d: %s\n", rank, world.status().to_string().c_str());
    std::exit(2);
  }
  r.world = *world;
  r.model = make_model();
  fsdp::WrapPolicy policy;
  policy.transformer_layer_cls_to_wrap = {"BlockImpl"};
  auto units = fsdp::make_units(*r.model, policy, /*recompute_layers=*/true);
  fsdp::FsdpOptions fo;
  fo.mixed_precision.param_dtype = at::kFloat;
  auto engine = fsdp::FsdpModule::wrap(r.model, *units, *collective::DeviceMesh::for_fsdp(r.world, -1), fo, optim());
  if (!engine.ok()) {
    std::fprintf(stderr, "bench_fsdp rank %d: %s\n", rank, engine.status().to_string().c_str());
    std::exit(3);
  }
  r.engine = std::move(*engine);
  return r;
}

// One FULL_SHARD step on this rank's half of the global batch.
Status fsdp_step(Rank& r, const at::Tensor& tokens) {
  int64_t n = kBatch / 2;
  at::Tensor mine = tokens.narrow(0, r.world->rank() * n, n);
  at::Tensor ids = mine.narrow(1, 0, kSeq), targets = mine.narrow(1, 1, kSeq);
  TESSERA_RETURN_IF_ERROR(r.engine->begin_forward(fsdp::ForwardMode::train));
  at::Tensor h = r.model->embed(ids);
  for (int i = 0; i < kLayers; ++i) {
    Block b = r.model->blocks[i];
    TESSERA_ASSIGN_OR_RETURN(h, r.engine->run_unit(i, [b](const at::Tensor& x) mutable { return b->forward(x); }, h));
  }
  TESSERA_RETURN_IF_ERROR(r.engine->backward(loss_of(r.model->head(h), targets)));
  TESSERA_ASSIGN_OR_RETURN(auto result, r.engine->step());
  (void)result;
  r.engine->lr_scheduler_step();
  return Status();
}

std::unique_ptr<Rank> g_rank;

void BM_fsdp_single_step(benchmark::State& state) {
  torch::set_num_threads(2);
  auto model = make_model();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  at::Tensor tokens = batch_tokens();
  at::Tensor ids = tokens.narrow(1, 0, kSeq), targets = tokens.narrow(1, 1, kSeq);
  for (auto _ : state) {
    opt.zero_grad();
    at::Tensor h = model->embed(ids);
    for (auto& b : model->blocks) h = b->forward(h);
    loss_of(model->head(h), targets).backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
  }
  state.SetItemsProcessed(state.iterations() * kBatch * kSeq);
}

void BM_fsdp_full_shard_step_2ranks(benchmark::State& state) {
  torch::set_num_threads(1);
  at::Tensor tokens = batch_tokens();
  for (auto _ : state) {
    at::Tensor cmd = at::ones({2}, at::kLong);
    Status st = g_rank->world->broadcast(cmd, 0);
    if (st.ok()) st = fsdp_step(*g_rank, tokens);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch * kSeq);
  torch::set_num_threads(2);
}

BENCHMARK(BM_fsdp_single_step)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_fsdp_full_shard_step_2ranks)->Unit(benchmark::kMillisecond)->UseRealTime();

int run_peer(int port) {
  torch::set_num_threads(1);
  Rank r = make_rank(1, port);
  at::Tensor tokens = batch_tokens();
  for (;;) {
    at::Tensor cmd = at::zeros({2}, at::kLong);
    if (!r.world->broadcast(cmd, 0).ok()) return 4;
    if (cmd[0].item<int64_t>() == 0) return 0;
    Status st = fsdp_step(r, tokens);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_fsdp peer: %s\n", st.to_string().c_str());
      return 5;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* port = std::getenv(kPeerEnv)) return run_peer(std::atoi(port));
  const auto launch = tessera::bench::init_and_spawn_peer(&argc, argv, kPeerEnv);
  if (!launch) return 1;
  g_rank = std::make_unique<Rank>(make_rank(0, launch->port));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  at::Tensor quit = at::zeros({2}, at::kLong);
  int rc = g_rank->world->broadcast(quit, 0).ok() ? 0 : 6;
  g_rank.reset();
  return tessera::bench::wait_peer(launch->peer, rc, 7);
}
