// python_dataset.cpp: see python_dataset.hpp.
#include "driver/python_dataset.hpp"

#include <chrono>
#include <functional>
#include <type_traits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "driver/config.hpp"
#include "runtime/python_child.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using runtime::Clock;

constexpr const char* kKey = "data.custom_cls";

// The child: verl's create_rl_dataset, then every item as JSON, a chunk of rows per line.
constexpr const char* kDatasetScript = R"PY(
import collections.abc
spec = json.loads(requests.readline())

try:
    from torch.utils.data import Dataset
    from verl.utils.import_utils import load_extern_type
    cls = load_extern_type(spec["path"], spec["name"])
    if cls is None or (not spec["sft"] and not (isinstance(cls, type) and issubclass(cls, Dataset))):
        raise TypeError(f"the custom dataset class '{spec['name']}' from '{spec['path']}' must inherit from "
                        "torch.utils.data.Dataset")
    if hasattr(cls, "on_batch_end"):
        raise TypeError(f"'{spec['name']}' defines on_batch_end, which verl calls after every step; Tessera reads "
                        "every item once, when the data loads")
    dataset = verl_dataset(spec, cls)
    size = len(dataset)
except BaseException as e:
    fatal(e)
send({"ready": True, "size": size})

def integers(item, key):
    values = plain(item[key]) if hasattr(item[key], "tolist") else list(item[key])
    for v in values:
        if not isinstance(v, (int, bool)) and not (isinstance(v, float) and v.is_integer()):
            raise ValueError(f"{key} holds {v!r}, not an integer")
    return [int(v) for v in values]

READ = {"input_ids", "attention_mask", "position_ids", "raw_prompt", "full_prompts", "data_source", "ability",
        "reward_model", "extra_info", "index", "tools_kwargs", "interaction_kwargs", "agent_name"}

def row_of(item):
    if not isinstance(item, collections.abc.Mapping):
        raise TypeError(f"the item is a {type(item).__name__}, not a mapping")
    item = dict(item)
    if item.get("multi_modal_data") or item.get("multi_modal_inputs"):
        raise ValueError("the item has multi_modal_data; Tessera's models are text-only")
    if spec["sft"]:
        return {k: integers(item, k) for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")}
    ids, mask = integers(item, "input_ids"), integers(item, "attention_mask")
    if len(ids) != len(mask):
        raise ValueError(f"input_ids has {len(ids)} tokens and attention_mask {len(mask)}")
    row = {"prompt_ids": [t for t, m in zip(ids, mask) if m]}
    if "raw_prompt_ids" in item and integers(item, "raw_prompt_ids") != row["prompt_ids"]:
        raise ValueError("raw_prompt_ids differ from input_ids under attention_mask, which Tessera generates from")
    for key in ("data_source", "ability", "reward_model", "extra_info", "raw_prompt", "agent_name", "index",
                "tools_kwargs", "interaction_kwargs"):
        if key in item:
            row[key] = item[key]
    # The item's other fields: verl's batch carries them as columns of the same name.
    row["columns"] = {k: v for k, v in item.items() if k not in READ and k != "raw_prompt_ids"}
    return encodable(row)

rows = []
for i in range(size):
    try:
        row = row_of(dataset[i])
    except Exception as e:
        row = {"error": f"{type(e).__name__}: {e}"}
    rows.append(row)
    if "error" in row or len(rows) == 256 or i == size - 1:
        send({"rows": rows})
        rows = []
        if "error" in row:
            sys.exit(0)  # the parent stops at the first bad item
send({"done": True})
)PY";

}  // namespace

const char* const kVerlDatasets = R"PY(
import traceback

def one_line(e):
    cause = f" (from {type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
    return " ".join(f"{type(e).__name__}: {e}{cause}".split())

def fatal(e):
    traceback.print_exc()  # to stderr: the user's own file's error, with its line
    send({"fatal": one_line(e)})
    sys.exit(1)

def verl_dataset(spec, cls):
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local
    tokenizer = hf_tokenizer(copy_to_local(spec["tokenizer"]), trust_remote_code=spec["trust_remote_code"])
    config = OmegaConf.create(spec["config"])
    files = spec["files"] if isinstance(spec["files"], str) else OmegaConf.create(spec["files"])  # as configured
    if spec.get("sft"):  # verl's create_sft_dataset
        return cls(parquet_files=files, tokenizer=tokenizer, config=config)
    return cls(data_files=files, tokenizer=tokenizer, processor=None, config=config)  # create_rl_dataset
)PY";

Result<json> configured_data_files(const json& cfg, const std::string& files_key) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::filesystem::path> paths, data_files(cfg, files_key));
  json files = json::array();
  for (const auto& f : paths) files.push_back(f.string());
  const json* configured = config_find(cfg, files_key);
  if (configured != nullptr && configured->is_string()) return files[0];  // verl passes a single path as it is
  return files;
}

namespace {

// The child's error for an item, if it sent one (a row that is not a mapping is one too).
Status item_error(const json& item, const std::string& where) {
  if (!item.is_object()) return make_error(ErrorCode::internal, "{}: the dataset process sent {}", where, item.dump().substr(0, 80));
  if (!item.contains("error")) return Status();
  const json& e = item["error"];
  return make_error(ErrorCode::corrupt_data, "{}: {}", where, e.is_string() ? e.get<std::string>() : e.dump());
}

// One item as a row; errors name it.
Result<RLHFRow> to_row(const json& item, const std::string& where, int64_t max_prompt_length) {
  TESSERA_RETURN_IF_ERROR(item_error(item, where));
  RLHFRow r;
  r.source = where;
  const json& source = item.value("data_source", json());
  if (!source.is_string()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'data_source' must be a string, got {}", where, source.dump());
  }
  r.data_source = source.get<std::string>();
  const json& ability = item.value("ability", json());
  r.ability = ability.is_string() ? ability.get<std::string>() : std::string();
  r.reward_model = item.value("reward_model", json());
  if (!r.reward_model.is_object()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'reward_model' must be a mapping with 'ground_truth', got {}", where,
                      r.reward_model.dump().substr(0, 80));
  }
  r.extra_info = item.value("extra_info", json());
  r.prompt = item.value("raw_prompt", json());
  const json& agent = item.value("agent_name", json());
  if (!agent.is_null() && !agent.is_string()) {
    return make_error(ErrorCode::corrupt_data, "{}: 'agent_name' must be a string, got {}", where, agent.dump());
  }
  if (agent.is_string()) r.agent_name = agent.get<std::string>();
  // verl's batch takes these from the item itself (its RLHFDataset copies them out of extra_info).
  for (auto [key, field] : {std::pair{"tools_kwargs", &r.tools_kwargs}, std::pair{"interaction_kwargs", &r.interaction_kwargs}}) {
    if (!item.contains(key) || item[key].is_null()) continue;
    if (!item[key].is_object()) {
      return make_error(ErrorCode::corrupt_data, "{}: '{}' must be a mapping, got {}", where, key, item[key].dump().substr(0, 80));
    }
    *field = item[key];
  }
  if (item.contains("index") && !item["index"].is_null()) {
    if (!item["index"].is_number_integer()) {
      return make_error(ErrorCode::corrupt_data, "{}: 'index' must be an integer, got {}", where, item["index"].dump());
    }
    r.index = item["index"].get<int64_t>();
  }
  const json columns = item.value("columns", json::object());
  for (const auto& [key, value] : columns.items()) {
    if (is_row_column(key)) r.columns[key] = value;
  }
  for (const auto& t : item.value("prompt_ids", json::array())) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return make_error(ErrorCode::corrupt_data, "{}: input_ids holds {}, not a token id", where, t.dump());
    }
    r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  if (r.prompt_ids.empty() || static_cast<int64_t>(r.prompt_ids.size()) > max_prompt_length) {
    return make_error(ErrorCode::corrupt_data, "{}: the prompt has {} tokens under attention_mask; "
                      "data.max_prompt_length is {}", where, r.prompt_ids.size(), max_prompt_length);
  }
  return r;
}

}  // namespace

namespace {

// data.custom_cls.{path,name} and the data section: what both trainers' classes are built from.
Result<PythonDatasetOptions> class_of(const json& cfg) {
  PythonDatasetOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.path, config_get<std::string>(cfg, "data.custom_cls.path"));
  TESSERA_ASSIGN_OR_RETURN(auto name, config_get<std::optional<std::string>>(cfg, "data.custom_cls.name"));
  if (!name || name->empty()) {
    return make_error(ErrorCode::invalid_argument, "data.custom_cls.name: the class to load from data.custom_cls.path={} "
                      "is not set", o.path);
  }
  o.name = *name;
  o.data_config = cfg.at("data");
  return o;
}

}  // namespace

Result<PythonDatasetOptions> PythonDatasetOptions::from_config(const json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(PythonDatasetOptions o, class_of(cfg));
  o.data_config["return_raw_chat"] = true;  // Tessera's batches always carry raw_prompt
  TESSERA_ASSIGN_OR_RETURN(auto tokenizer, config_get<std::optional<std::string>>(cfg, "data.tokenizer"));
  TESSERA_ASSIGN_OR_RETURN(std::string model, config_get<std::string>(cfg, "actor_rollout_ref.model.path"));
  o.tokenizer_path = tokenizer.value_or(model);
  TESSERA_ASSIGN_OR_RETURN(o.trust_remote_code, config_get_or<bool>(cfg, "data.trust_remote_code", false));
  return o;
}

Result<PythonDatasetOptions> PythonDatasetOptions::from_sft_config(const json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(PythonDatasetOptions o, class_of(cfg));
  o.sft = true;
  TESSERA_ASSIGN_OR_RETURN(o.tokenizer_path, config_get<std::string>(cfg, "model.partial_pretrain"));
  TESSERA_ASSIGN_OR_RETURN(o.trust_remote_code, config_get_or<bool>(cfg, "model.trust_remote_code", false));
  return o;
}

namespace {

// Builds the class over the files `files_key` names (as configured: a path or a list) and hands
// every item, as the child converted it (an RL row or SFT columns), to `take`, a chunk at a time.
Status read_items(const json& cfg, const std::string& files_key, const PythonDatasetOptions& options,
                  const std::string& what, const std::function<Status(const json& item, int64_t index)>& take) {
  TESSERA_ASSIGN_OR_RETURN(json files, configured_data_files(cfg, files_key));
  const std::string python = options.python.empty() ? runtime::python_from_env("TESSERA_DATA_PYTHON") : options.python;
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild child, runtime::spawn_python(python, std::string(kVerlDatasets) + kDatasetScript, {}, kKey));
  struct Reap {
    runtime::PythonChild& child;
    ~Reap() {
      if (child.pid > 0) runtime::kill_child(child);
    }
  } reap{child};
  const json spec = {{"path", options.path},
                     {"name", options.name},
                     {"sft", options.sft},
                     {"tokenizer", options.tokenizer_path},
                     {"trust_remote_code", options.trust_remote_code},
                     {"config", options.data_config},
                     {"files", files}};
  TESSERA_RETURN_IF_ERROR(
      runtime::write_all(child, spec.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", Clock::now() + std::chrono::minutes(1)));
  // Building the class may read and tokenize its whole dataset (verl sets no limit); each later
  // message is a chunk of items.
  auto next = [&](Clock::time_point deadline) -> Result<json> {
    Result<std::string> line = runtime::read_line(child, deadline);
    if (!line.ok()) return make_error(line.status().code(), "{}: the dataset process: {}", what, line.status().message());
    json message = json::parse(*line, nullptr, false);
    if (!message.is_object()) {
      return make_error(ErrorCode::internal, "{}: the dataset process wrote '{}'", what,
                        runtime::first_line(*line).substr(0, 120));
    }
    if (message.contains("fatal")) {
      const json& f = message["fatal"];
      return make_error(ErrorCode::invalid_argument, "{}: {}", what, f.is_string() ? f.get<std::string>() : f.dump());
    }
    return message;
  };
  TESSERA_ASSIGN_OR_RETURN(json ready, next(Clock::time_point::max()));
  const int64_t size = ready.value("size", json()).is_number_integer() ? ready["size"].get<int64_t>() : -1;
  if (size < 0) return make_error(ErrorCode::internal, "{}: the dataset process gave no size", what);
  int64_t seen = 0;
  while (seen < size) {
    TESSERA_ASSIGN_OR_RETURN(json chunk, next(Clock::now() + std::chrono::minutes(30)));
    if (!chunk.contains("rows") || !chunk["rows"].is_array() || chunk["rows"].empty()) {
      return make_error(ErrorCode::internal, "{}: the dataset process sent no items", what);
    }
    for (const json& item : chunk["rows"]) TESSERA_RETURN_IF_ERROR(take(item, seen++));
  }
  TESSERA_RETURN_IF_ERROR(next(Clock::now() + std::chrono::minutes(1)).status());  // "done"
  runtime::finish_child(child, std::chrono::seconds(10));  // the class's atexit handlers run
  return Status();
}

std::string describe(const PythonDatasetOptions& options, const std::string& files_key) {
  return fmt::format("{} ({} from {}) over {}", kKey, options.name, options.path, files_key);
}

// An SFT item: four columns of exactly `max_length` integers (mask columns 0 or 1).
Result<SFTExample> to_example(const json& item, const std::string& where, int64_t max_length) {
  TESSERA_RETURN_IF_ERROR(item_error(item, where));
  SFTExample ex;
  ex.source = where;
  // Reads column `key`: max_length integers in [0, top].
  auto column = [&](const char* key, int64_t top, auto& out) -> Status {
    const json& values = item.value(key, json());
    if (!values.is_array() || static_cast<int64_t>(values.size()) != max_length) {
      return make_error(ErrorCode::corrupt_data, "{}: {} has {} values; data.max_length is {}", where, key,
                        values.is_array() ? values.size() : 0, max_length);
    }
    out.reserve(values.size());
    for (const auto& v : values) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > top) {
        return make_error(ErrorCode::corrupt_data, "{}: {} holds {}", where, key, v.dump());
      }
      out.push_back(static_cast<typename std::decay_t<decltype(out)>::value_type>(v.get<int64_t>()));
    }
    return Status();
  };
  TESSERA_RETURN_IF_ERROR(column("input_ids", INT32_MAX, ex.item_ids));
  TESSERA_RETURN_IF_ERROR(column("attention_mask", 1, ex.item_mask));
  TESSERA_RETURN_IF_ERROR(column("position_ids", INT32_MAX, ex.item_positions));
  TESSERA_RETURN_IF_ERROR(column("loss_mask", 1, ex.item_loss));
  return ex;
}

}  // namespace

namespace {

// Every item of the class, converted by `convert(item, where)`.
template <class T, class Convert>
Result<std::vector<T>> read_all(const json& cfg, const std::string& files_key, const PythonDatasetOptions& options,
                                Convert convert) {
  const std::string what = describe(options, files_key);
  std::vector<T> out;
  TESSERA_RETURN_IF_ERROR(read_items(cfg, files_key, options, what, [&](const json& item, int64_t i) -> Status {
    TESSERA_ASSIGN_OR_RETURN(T x, convert(item, fmt::format("{}: item {}", what, i)));
    out.push_back(std::move(x));
    return Status();
  }));
  return out;
}

}  // namespace

Result<std::vector<RLHFRow>> read_python_dataset(const json& cfg, const std::string& files_key,
                                                 const PythonDatasetOptions& options, int64_t max_prompt_length) {
  return read_all<RLHFRow>(cfg, files_key, options, [&](const json& item, const std::string& where) {
    return to_row(item, where, max_prompt_length);
  });
}

Result<std::vector<SFTExample>> read_python_sft_dataset(const json& cfg, const std::string& files_key,
                                                        const PythonDatasetOptions& options, int64_t max_length) {
  return read_all<SFTExample>(cfg, files_key, options, [&](const json& item, const std::string& where) {
    return to_example(item, where, max_length);
  });
}

}  // namespace tessera::driver
