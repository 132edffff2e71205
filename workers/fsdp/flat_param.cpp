// flat_param.cpp: Note [Flat layout] in flat_param.hpp.
#include "workers/fsdp/flat_param.hpp"

#include <set>

namespace tessera::fsdp {

Result<FlatLayout> make_flat_layout(
    const std::string& unit, const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
    int shard_count) {
  if (shard_count < 1) {
    return make_error(ErrorCode::invalid_argument, "flat layout of unit '{}': shard count {} < 1",
                      unit, shard_count);
  }
  if (params.empty()) {
    return make_error(ErrorCode::invalid_argument, "flat layout of unit '{}': no parameters", unit);
  }
  FlatLayout layout;
  layout.unit = unit;
  layout.shard_count = shard_count;
  std::set<std::string> seen;
  for (const auto& [name, shape] : params) {
    if (!seen.insert(name).second) {
      return make_error(ErrorCode::invalid_argument,
                        "flat layout of unit '{}': parameter '{}' appears twice", unit, name);
    }
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) {
        return make_error(ErrorCode::invalid_argument,
                          "flat layout of unit '{}': parameter '{}' has negative dimension {}",
                          unit, name, d);
      }
      numel *= d;
    }
    layout.params.push_back({name, shape, layout.numel, numel});
    layout.numel += numel;
  }
  layout.padded_numel = (layout.numel + shard_count - 1) / shard_count * shard_count;
  if (layout.padded_numel == 0) layout.padded_numel = shard_count;  // keep every shard non-empty
  return layout;
}

FlatLayout FlatLayout::with_shard_count(int shards) const {
  FlatLayout out = *this;
  out.shard_count = shards;
  out.padded_numel = (numel + shards - 1) / shards * shards;
  if (out.padded_numel == 0) out.padded_numel = shards;
  return out;
}

nlohmann::json flat_layout_to_json(const FlatLayout& layout) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : layout.params) {
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
  }
  return {{"unit", layout.unit},
          {"numel", layout.numel},
          {"padded_numel", layout.padded_numel},
          {"shard_count", layout.shard_count},
          {"params", params}};
}

namespace {

template <class T>
Result<T> field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    return make_error(ErrorCode::corrupt_data, "{}: missing field '{}'", where, key);
  }
  try {
    return j.at(key).get<T>();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt_data, "{}: field '{}' has the wrong type", where, key);
  }
}

}  // namespace

Result<FlatLayout> flat_layout_from_json(const nlohmann::json& j, const std::string& source) {
  TESSERA_ASSIGN_OR_RETURN(std::string unit, field<std::string>(j, "unit", source));
  std::string where = source + " unit '" + unit + "'";
  TESSERA_ASSIGN_OR_RETURN(int shard_count, field<int>(j, "shard_count", where));
  TESSERA_ASSIGN_OR_RETURN(int64_t numel, field<int64_t>(j, "numel", where));
  TESSERA_ASSIGN_OR_RETURN(int64_t padded, field<int64_t>(j, "padded_numel", where));
  if (!j.contains("params") || !j["params"].is_array()) {
    return make_error(ErrorCode::corrupt_data, "{}: missing array 'params'", where);
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  for (const auto& p : j["params"]) {
    TESSERA_ASSIGN_OR_RETURN(std::string name, field<std::string>(p, "name", where));
    TESSERA_ASSIGN_OR_RETURN(auto shape, field<std::vector<int64_t>>(p, "shape", where));
    params.emplace_back(std::move(name), std::move(shape));
  }
  auto layout = make_flat_layout(unit, params, shard_count);
  if (!layout.ok()) return Status(ErrorCode::corrupt_data, source + ": " + layout.status().message());
  for (size_t i = 0; i < params.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(int64_t offset, field<int64_t>(j["params"][i], "offset", where));
    if (offset != layout->params[i].offset) {
      return make_error(ErrorCode::corrupt_data, "{}: parameter '{}' offset {} != expected {}",
                        where, params[i].first, offset, layout->params[i].offset);
    }
  }
  if (numel != layout->numel || padded != layout->padded_numel) {
    return make_error(ErrorCode::corrupt_data,
                      "{}: numel {} / padded_numel {} disagree with the parameters ({} / {})",
                      where, numel, padded, layout->numel, layout->padded_numel);
  }
  return layout;
}

std::vector<ShardPiece> pieces_for_range(const FlatLayout& old_layout, int64_t begin, int64_t end) {
  std::vector<ShardPiece> pieces;
  end = std::min(end, old_layout.numel);
  int64_t s = old_layout.shard_numel();
  for (int64_t pos = begin; pos < end;) {
    int shard = static_cast<int>(pos / s);
    int64_t in_shard = pos - shard * s;
    int64_t length = std::min(end - pos, s - in_shard);
    pieces.push_back({shard, in_shard, pos - begin, length});
    pos += length;
  }
  return pieces;
}

}  // namespace tessera::fsdp
