// safetensors_checkpoint.cpp: HF checkpoint directories, single-file or sharded with an index.
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "proto/atomic_file.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Result<json> read_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::not_found, "{}: cannot open", path);
  json j = json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(ErrorCode::corrupt_data, "{}: not a JSON object", path);
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    return make_error(ErrorCode::corrupt_data, "{}: missing object 'weight_map'", path);
  }
  for (const auto& [name, file] : j["weight_map"].items()) {
    std::string f = file.is_string() ? file.get<std::string>() : "";
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return make_error(ErrorCode::corrupt_data, "{}: tensor '{}': bad shard file name {}", path, name, file.dump());
    }
  }
  return j;
}

Result<TensorMap> read_sharded(const std::string& dir, const std::string& index_path) {
  TESSERA_ASSIGN_OR_RETURN(json index, read_index(index_path));
  std::map<std::string, std::set<std::string>> wanted;  // shard file -> tensor names
  for (const auto& [name, file] : index["weight_map"].items()) wanted[file.get<std::string>()].insert(name);
  TensorMap out;
  for (const auto& [file, names] : wanted) {
    std::string shard = (fs::path(dir) / file).string();
    TESSERA_ASSIGN_OR_RETURN(SafetensorsContents contents, read_safetensors(shard));
    for (const std::string& name : names) {
      auto it = contents.tensors.find(name);
      if (it == contents.tensors.end()) {
        return make_error(ErrorCode::corrupt_data, "{}: tensor '{}' listed in {} is missing", shard, name, index_path);
      }
      out.emplace(name, it->second);
    }
  }
  return out;
}

std::string shard_name(const std::string& prefix, size_t i, size_t n) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", prefix, i + 1, n);
}

// HF's greedy split: fill a shard until the next tensor would overflow it.
std::vector<TensorMap> split_shards(const TensorMap& tensors, int64_t max_bytes) {
  std::vector<TensorMap> shards(1);
  int64_t current = 0;
  for (const auto& [name, t] : tensors) {
    int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (current > 0 && current + bytes > max_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, t);
    current += bytes;
  }
  return shards;
}

void remove_if_exists(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

}  // namespace

Result<TensorMap> read_safetensors_checkpoint(const std::string& dir, const std::string& prefix) {
  fs::path index = fs::path(dir) / (prefix + ".safetensors.index.json");
  if (fs::exists(index)) return read_sharded(dir, index.string());
  fs::path single = fs::path(dir) / (prefix + ".safetensors");
  if (!fs::exists(single)) {
    return make_error(ErrorCode::not_found, "{}: neither {} nor {} exists", dir, single.filename().string(),
                      index.filename().string());
  }
  TESSERA_ASSIGN_OR_RETURN(SafetensorsContents contents, read_safetensors(single.string()));
  return std::move(contents.tensors);
}

Status write_safetensors_checkpoint(const std::string& dir, const TensorMap& tensors,
                                    const CheckpointWriteOptions& options) {
  fs::path index = fs::path(dir) / (options.prefix + ".safetensors.index.json");
  fs::path single = fs::path(dir) / (options.prefix + ".safetensors");
  std::vector<TensorMap> shards = split_shards(tensors, options.max_shard_bytes);
  if (shards.size() == 1) {
    TESSERA_RETURN_IF_ERROR(write_safetensors(single.string(), tensors));
    remove_if_exists(index);
    return Status();
  }
  json weight_map = json::object();
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string file = shard_name(options.prefix, i, shards.size());
    TESSERA_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / file).string(), shards[i]));
    for (const auto& [name, t] : shards[i]) {
      weight_map[name] = file;
      total += static_cast<int64_t>(t.nbytes());
    }
  }
  json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic(index.string(), j.dump(2) + "\n"));
  remove_if_exists(single);
  return Status();
}

}  // namespace tessera::models
