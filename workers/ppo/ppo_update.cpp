// ppo_update.cpp: the actor / critic update loop (see ppo_update.hpp).
#include "workers/ppo/ppo_update.hpp"

#include <torch/torch.h>

#include "proto/host_transfer.hpp"

namespace tessera::ppo {

Result<proto::DataProto> select_update_inputs(const proto::DataProto& data,
                                              const std::vector<std::string>& response_keys) {
  TESSERA_ASSIGN_OR_RETURN(auto seq, read_sequence_batch(data));
  std::vector<std::string> keys = kPpoForwardKeys;
  for (const auto& key : response_keys) {
    TESSERA_RETURN_IF_ERROR(read_response_tensor(data, key, seq).status());
    keys.push_back(key);
  }
  TESSERA_RETURN_IF_ERROR(read_response_mask(data, seq).status());
  if (data.batch().contains("response_mask")) keys.emplace_back("response_mask");
  return data.select(keys, std::vector<std::string>{});
}

namespace {

Result<MicroBatches> micro_batches_for_update(const proto::DataProto& mini_batch, const UpdateSchedule& s,
                                              const MicroBatchCountSync& sync) {
  if (s.use_dynamic_bsz) {
    return rearrange_micro_batches(mini_batch, s.max_token_len, s.role + ".ppo_max_token_len_per_gpu", sync);
  }
  return split_micro_batches(mini_batch, *s.ppo_micro_batch_size_per_gpu, s.role + ".ppo_micro_batch_size_per_gpu");
}

// Metric tensors of one mini-batch, read back to the host together.
class PendingMetrics {
 public:
  void add(const std::map<std::string, at::Tensor>& values) {
    TORCH_CHECK(!started_, "PendingMetrics: add() after start() would not be read back");
    for (const auto& [name, t] : values) entries_.emplace_back(name, t);
  }

  // Queues one device-to-host copy of all of them, ahead of the optimizer step: the step's
  // grad-norm read then waits for it too, and flush() finds the values landed.
  void start() {
    if (entries_.empty()) return;
    std::vector<at::Tensor> values;
    values.reserve(entries_.size());
    const c10::Device device = entries_.front().second.device();
    for (const auto& e : entries_) values.push_back(e.second.detach().reshape({}).to(device, at::kDouble));
    readback_ = proto::HostReadback(at::stack(values));
    started_ = true;
  }

  // Host boundary, deliberate: metrics are host data (the trainer logs them). Appended in the
  // order they were recorded.
  void flush(Metrics& metrics) {
    if (entries_.empty()) return;
    if (!started_) start();
    const at::Tensor& host = readback_.wait();
    const double* v = host.data_ptr<double>();
    for (size_t i = 0; i < entries_.size(); ++i) metrics[entries_[i].first].push_back(v[i]);
    entries_.clear();
    started_ = false;
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> entries_;
  proto::HostReadback readback_;
  bool started_ = false;
};

Status update_micro_batch(TrainableModule& module, const proto::DataProto& micro_batch, double loss_scale,
                          const UpdateSchedule& s, const at::Tensor& host_mask, const MicroLossFn& micro_loss,
                          PendingMetrics& metrics) {
  TESSERA_ASSIGN_OR_RETURN(auto seq, read_sequence_batch(micro_batch));
  TESSERA_ASSIGN_OR_RETURN(ResponseHead head, response_head(module, seq, ForwardMode::train, s.use_remove_padding,
                                                            host_mask, s.sequence_parallel));
  auto loss = micro_loss(micro_batch, seq, head);
  if (!loss.ok()) {
    (void)module.end_forward();
    return loss.status();
  }
  TESSERA_RETURN_IF_ERROR(module.backward(loss->loss * loss_scale));
  metrics.add(loss->metrics);
  return Status();
}

Status update_mini_batch(TrainableModule& module, const proto::DataProto& mini_batch, const UpdateSchedule& s,
                         const MicroBatchCountSync& sync, const MicroLossFn& micro_loss, Metrics& metrics) {
  TESSERA_ASSIGN_OR_RETURN(auto micro, micro_batches_for_update(mini_batch, s, sync));
  TESSERA_ASSIGN_OR_RETURN(auto host_masks, micro_batch_host_masks(mini_batch, micro, s.use_remove_padding));
  module.zero_grad();
  PendingMetrics pending;
  for (size_t i = 0; i < micro.batches.size(); ++i) {
    const proto::DataProto& micro_batch = micro.batches[i];
    // verl v0.5.0's scaling: token share of the configured mini-batch (dynamic) or 1/grad_accum.
    const double scale = s.use_dynamic_bsz
                             ? static_cast<double>(micro_batch.size()) / static_cast<double>(s.ppo_mini_batch_size)
                             : 1.0 / static_cast<double>(s.ppo_mini_batch_size / *s.ppo_micro_batch_size_per_gpu);
    TESSERA_RETURN_IF_ERROR(update_micro_batch(module, micro_batch, scale, s, host_masks[i], micro_loss, pending));
  }
  pending.start();  // before the step: its one host read covers the metrics (Note [Host transfers])
  TESSERA_ASSIGN_OR_RETURN(StepOutcome step, module.clip_and_step(s.grad_clip));
  pending.flush(metrics);
  append_to_dict(metrics, {{s.role + "/grad_norm", step.grad_norm}});
  return Status();
}

}  // namespace

Result<Metrics> run_ppo_update(TrainableModule& module, const proto::DataProto& selected,
                               const UpdateSchedule& schedule, const MicroBatchCountSync& sync,
                               const MicroLossFn& micro_loss) {
  // verl v0.5.0: sequential mini-batches, no shuffle (Note in dp_actor.hpp).
  TESSERA_ASSIGN_OR_RETURN(auto mini_batches, selected.split(schedule.ppo_mini_batch_size));
  Metrics metrics;
  for (int64_t epoch = 0; epoch < schedule.ppo_epochs; ++epoch) {
    for (const auto& mini_batch : mini_batches) {
      TESSERA_RETURN_IF_ERROR(update_mini_batch(module, mini_batch, schedule, sync, micro_loss, metrics));
    }
  }
  module.zero_grad();
  append_to_dict(metrics, {{schedule.role + "/lr", module.lr()}});
  return metrics;
}

}  // namespace tessera::ppo
