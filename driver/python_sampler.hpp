// python_sampler.hpp: verl's data.sampler.class_path: the user's sampler (a subclass of verl's
// AbstractSampler, e.g. a curriculum sampler) picks the rows of every training batch, run by
// Python in a child process (runtime/python_child.hpp) for the whole run.
//
// The child does what verl's create_rl_sampler does: it builds the dataset the sampler reads
// (verl's RLHFDataset over data.train_files, or the data.custom_cls class, as create_rl_dataset
// builds it), load_extern_type(class_path, class_name), cls(data_source=dataset, data_config=<the
// data section>), and checks that it subclasses AbstractSampler. The dataset must have as many
// rows as Tessera's training set (the same files, filters and order), or the run stops naming the
// key. Each epoch iterates the sampler afresh (iter(sampler)); a batch is the next
// data.gen_batch_size indices (data.train_batch_size unless DAPO's recipe sets it), and an epoch
// ends when fewer are left (verl's drop_last), so an epoch has len(sampler) / that many batches. After every training step, a sampler that
// subclasses AbstractCurriculumSampler gets the step's whole batch as a verl DataProto
// (sampler.update(batch=...)): every tensor and non-tensor column of the batch the trainer
// updated the actor with (its rows in the order balance_batch left them), and its meta_info, as
// verl passes it. The next batch is drawn after that update. The update comes before the step's
// validation and checkpoint, so the checkpoint holds the sampler's state after it (verl updates
// after saving: a run it resumes misses that step's update).
//
// Resume: the checkpoint holds the epoch, the indices taken in it and, when the sampler has
// state_dict() / load_state_dict(), its state (pickled) twice: as it was when the epoch's
// iterator was taken, and as it is now. A resumed run restores the first, takes the iterator and
// skips the indices already taken (torchdata's StatefulDataLoader, which verl uses, fast-forwards
// a custom sampler the same way), then restores the second: a sampler whose iteration depends on
// its state (a seeded generator, an epoch counter) continues the interrupted epoch's order. The
// class must be the one that drew the order.
//
// Thread-safety: none; the trainer's thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/python_child.hpp"

namespace tessera::driver {

class PythonSampler {
 public:
  /// Starts the sampler of `cfg`'s data.sampler (class_path set) over a training set of
  /// `dataset_size` rows, drawing batches of `batch_size`. Errors name data.sampler.class_path.
  static Result<std::unique_ptr<PythonSampler>> start(const nlohmann::json& cfg, int64_t dataset_size,
                                                      int64_t batch_size);
  ~PythonSampler();
  PythonSampler(const PythonSampler&) = delete;
  PythonSampler& operator=(const PythonSampler&) = delete;

  /// Batches per epoch: len(sampler) / batch_size.
  int64_t size() const { return length_ / batch_size_; }
  /// The next batch's row indices; nullopt when the epoch is over (the next call starts the next).
  /// After a failed call every later one fails the same way.
  Result<std::optional<std::vector<int64_t>>> next();
  /// The epoch the next batch comes from (0-based) and how many batches of it were taken.
  int64_t epoch() const { return epoch_; }
  int64_t batch_index() const { return batch_index_; }
  /// A curriculum sampler's update(batch=...) with the step's batch; nothing for another sampler.
  Status update(const proto::DataProto& batch);
  /// {"class", "epoch", "yielded", "sampler_state", "epoch_state"} (states: base64 pickles or null).
  Result<nlohmann::json> state_dict();
  /// Restores a state_dict() (see the header comment).
  Status load_state_dict(const nlohmann::json& state);

 private:
  PythonSampler() = default;
  Result<nlohmann::json> call(const nlohmann::json& request);
  Result<nlohmann::json> exchange(const nlohmann::json& request);

  runtime::PythonChild child_;
  std::string what_;  ///< "data.sampler.class_path (Name from path)", for errors.
  int64_t dataset_size_ = 0, batch_size_ = 1, length_ = 0;
  int64_t epoch_ = 0, batch_index_ = 0;
  bool in_epoch_ = false;  ///< iter(sampler) was taken for epoch_.
  int64_t skip_ = 0;       ///< Indices the next iter(sampler) skips (a resumed epoch's).
  bool curriculum_ = false, stateful_ = false;
  Status broken_;  ///< Set by the first failed call (the child is then gone).
};

}  // namespace tessera::driver
