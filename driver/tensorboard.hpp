// tensorboard.hpp: the `tensorboard` logger backend, written natively: TensorBoard event files
// (TFRecord framing with masked CRC-32C, tensorflow.Event protobuf messages) holding one scalar
// summary per metric and step, and trainer.log_val_generations' samples as verl's text summary
// (val/generations). The directory is verl's: $TENSORBOARD_DIR, else
// tensorboard_log/<trainer.project_name>/<trainer.experiment_name>. A run that resumes after step
// N writes a SessionLog START at N + 1, so TensorBoard drops the steps a killed run logged past
// its checkpoint (each step is then shown once).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "driver/logger.hpp"
#include "proto/status.hpp"

namespace tessera::driver {

class TensorBoardLogger final : public MetricLogger {
 public:
  /// Creates `dir` and a new event file in it. Errors name the path.
  static Result<std::unique_ptr<TensorBoardLogger>> open(const std::filesystem::path& dir);
  ~TensorBoardLogger() override;
  Status log(const Metrics& metrics, int64_t step) override;
  Status start_at(int64_t step) override;
  Status log_generations(const std::vector<GenerationSample>& samples, int64_t step) override;
  const std::filesystem::path& path() const { return path_; }

 private:
  TensorBoardLogger(std::filesystem::path path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  Status write_event(const std::string& event);
  std::filesystem::path path_;
  std::FILE* file_;
};

/// verl's directory for the tensorboard backend (see the header comment).
std::filesystem::path tensorboard_dir(const std::string& project_name, const std::string& experiment_name);

/// The masked CRC-32C TFRecord frames carry (exposed for tests).
uint32_t tfrecord_masked_crc(const void* data, size_t n);

}  // namespace tessera::driver
