// Generation dumps and logged validation samples (driver/generations.hpp).
#include "driver/generations.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "proto/atomic_file.hpp"

namespace tessera::driver {
namespace {

std::vector<int32_t> masked_ids(const at::Tensor& ids, const at::Tensor& mask) {
  std::vector<int32_t> out;
  auto id = ids.accessor<int64_t, 1>();
  auto m = mask.accessor<int64_t, 1>();
  for (int64_t j = 0; j < id.size(0); ++j) {
    if (m[j] != 0) out.push_back(static_cast<int32_t>(id[j]));
  }
  return out;
}

}  // namespace

Result<Generations> decode_generations(const proto::DataProto& batch, const tokenizer::Tokenizer& tokenizer,
                                       std::vector<double> scores) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor prompts, batch.tensor("prompts"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, batch.tensor("responses"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, batch.tensor("attention_mask"));
  // The driver's batch is on the host already (DataProtos cross workers on the host); decoding
  // to text reads the ids one by one there.
  prompts = prompts.to(torch::kCPU, torch::kInt64).contiguous();
  responses = responses.to(torch::kCPU, torch::kInt64).contiguous();
  mask = mask.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t n = batch.size(), p = prompts.size(1);
  if (static_cast<int64_t>(scores.size()) != n) {
    return make_error(ErrorCode::internal, "decode_generations: {} scores for {} samples", scores.size(), n);
  }
  Generations g;
  g.scores = std::move(scores);
  tokenizer::DecodeOptions options;
  options.skip_special_tokens = true;
  options.lossy_utf8 = true;
  auto rm = batch.column("reward_model");
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_ASSIGN_OR_RETURN(std::string in, tokenizer.decode(masked_ids(prompts[i], mask[i].slice(0, 0, p)), options));
    TESSERA_ASSIGN_OR_RETURN(std::string out, tokenizer.decode(masked_ids(responses[i], mask[i].slice(0, p)), options));
    g.inputs.push_back(std::move(in));
    g.outputs.push_back(std::move(out));
    nlohmann::json gt = nullptr;
    if (rm.ok()) {
      const nlohmann::json r = rm->row_json(i);
      if (r.is_object() && r.contains("ground_truth")) gt = r["ground_truth"];
    }
    g.gts.push_back(std::move(gt));
  }
  return g;
}

Status dump_generations(const Generations& g, int64_t step, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create {}: {}", dir.string(), ec.message());
  const size_t n = g.inputs.size();
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    nlohmann::json entry = {{"input", g.inputs[i]}, {"output", g.outputs[i]}, {"gts", g.gts[i]},
                            {"score", g.scores[i]}, {"step", step}};
    for (const auto& [key, values] : g.extra) {
      if (values.size() == n) entry[key] = values[i];  // verl keeps the per-sample lists only
    }
    text += entry.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  return proto::write_file_atomic((dir / fmt::format("{}.jsonl", step)).string(), text);
}

std::vector<size_t> numpy_shuffled_order(size_t n, uint32_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 mt(seed);  // RandomState(int) seeds MT19937 with init_genrand(seed)
  for (size_t i = n; i-- > 1;) {
    // NumPy's random_interval(i): the smallest all-ones mask covering i, redrawn until <= i.
    uint32_t mask = static_cast<uint32_t>(i);
    for (int s = 1; s < 32; s <<= 1) mask |= mask >> s;
    uint32_t j;
    do {
      j = static_cast<uint32_t>(mt()) & mask;
    } while (j > i);
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<GenerationSample> val_generation_samples(const Generations& g, int64_t n) {
  if (n <= 0) return {};
  std::vector<size_t> by_input(g.inputs.size());
  std::iota(by_input.begin(), by_input.end(), size_t{0});
  // verl: samples.sort(key=lambda x: x[0]), a stable sort on the input (compared as code
  // points; UTF-8 byte order is the same order).
  std::stable_sort(by_input.begin(), by_input.end(), [&](size_t a, size_t b) { return g.inputs[a] < g.inputs[b]; });
  const std::vector<size_t> order = numpy_shuffled_order(by_input.size(), 42);
  std::vector<GenerationSample> samples;
  for (size_t k = 0; k < order.size() && static_cast<int64_t>(k) < n; ++k) {
    const size_t i = by_input[order[k]];
    samples.push_back({g.inputs[i], g.outputs[i], g.scores[i]});
  }
  return samples;
}

std::vector<std::string> val_generation_lines(const Generations& g, int64_t n) {
  std::vector<std::string> lines;
  for (const GenerationSample& s : val_generation_samples(g, n)) {
    lines.push_back(fmt::format("[validation sample {}] score={}\n[input] {}\n[output] {}", lines.size() + 1, s.score,
                                s.input, s.output));
  }
  return lines;
}

}  // namespace tessera::driver
