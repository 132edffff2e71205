// python_sampler.cpp: see python_sampler.hpp.
#include "driver/python_sampler.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "driver/config.hpp"
#include "driver/data.hpp"
#include "driver/python_dataset.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using runtime::Clock;

// The child: verl's create_rl_dataset and create_rl_sampler, then one request per line.
constexpr const char* kSamplerScript = R"PY(
import base64, operator, pickle, traceback
spec = json.loads(requests.readline())

try:
    import torch
    import numpy as np
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler, AbstractSampler
    from verl.utils.import_utils import load_extern_type
    if spec["dataset_path"]:  # data.custom_cls
        dataset_cls = load_extern_type(spec["dataset_path"], spec["dataset_name"])
    else:
        from verl.utils.dataset.rl_dataset import RLHFDataset as dataset_cls
    dataset = verl_dataset(spec, dataset_cls)
    cls = load_extern_type(spec["path"], spec["name"])
    sampler = cls(data_source=dataset, data_config=OmegaConf.create(spec["config"]))
    if not isinstance(sampler, AbstractSampler):
        raise TypeError(f"'{spec['name']}' from '{spec['path']}' must subclass "
                        "verl.experimental.dataset.sampler.AbstractSampler")
    length = len(sampler)
except BaseException as e:
    fatal(e)
stateful = hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")
send({"dataset_size": len(dataset), "length": length, "stateful": stateful,
      "curriculum": isinstance(sampler, AbstractCurriculumSampler)})

DTYPES = {"int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
          "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

def objects(values):
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out

def pickled(state):
    return base64.b64encode(pickle.dumps(state)).decode()

# `it` is the epoch's iterator; the sampler's state when it was taken (stateful samplers) lets a
# resumed run take the same iterator again before the later state is restored.
it, epoch_state, pending = None, None, None
for line in requests:
    msg = json.loads(line)
    try:
        if msg["op"] == "epoch":
            it = None
            epoch_state = pickled(sampler.state_dict()) if stateful else None
            fresh = iter(sampler)
            for _ in range(msg["skip"]):  # a resumed epoch: the batches already taken
                if next(fresh, None) is None:
                    break
            if pending is not None:
                sampler.load_state_dict(pickle.loads(base64.b64decode(pending)))
                pending = None
            it = fresh
            send({"ok": True})
        elif msg["op"] == "draw":
            if it is None:
                raise RuntimeError("no epoch to draw from (an earlier call failed)")
            out = []
            for i in it:
                out.append(operator.index(i))
                if len(out) == msg["n"]:
                    break
            send({"indices": out})
        elif msg["op"] == "update":
            b = msg["batch"]
            with open(b["file"], "rb") as f:
                raw = bytearray(f.read())
            tensors = {}
            for k, t in b["tensors"].items():
                n = t["count"]
                flat = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]], count=n, offset=t["offset"]) if n else \
                    torch.empty(0, dtype=DTYPES[t["dtype"]])
                tensors[k] = flat.reshape(t["shape"])
            batch = DataProto.from_dict(tensors=tensors, non_tensors={k: objects(v) for k, v in b["non_tensors"].items()},
                                        meta_info=b["meta_info"])
            sampler.update(batch=batch)
            send({"ok": True})
        elif msg["op"] == "state":
            send({"state": pickled(sampler.state_dict()) if stateful else None, "epoch_state": epoch_state})
        elif msg["op"] == "load":  # the epoch's state now, the later one once its iterator is taken
            if msg["epoch_state"] is not None:
                sampler.load_state_dict(pickle.loads(base64.b64decode(msg["epoch_state"])))
            pending = msg["state"]
            send({"ok": True})
    except Exception as e:
        traceback.print_exc()
        if msg["op"] in ("epoch", "draw"):
            it = None
        send({"error": one_line(e)})
)PY";

// verl's dtype names (torch's) for the tensors a batch carries.
Result<std::string> dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kLong: return std::string("int64");
    case at::kInt: return std::string("int32");
    case at::kByte: return std::string("uint8");
    case at::kBool: return std::string("bool");
    case at::kFloat: return std::string("float32");
    case at::kDouble: return std::string("float64");
    case at::kBFloat16: return std::string("bfloat16");
    case at::kHalf: return std::string("float16");
    default: break;
  }
  return make_error(ErrorCode::unimplemented, "a batch tensor of dtype {} has no verl counterpart", c10::toString(t));
}

// A batch's tensors for the child: their bytes one after another in `file` (the child reads it
// once and views each with torch.frombuffer), each described by dtype, shape, offset and count.
Result<json> write_tensors(const proto::DataProto& batch, const std::filesystem::path& file, const std::string& what) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorCode::io_error, "{}: cannot write '{}'", what, file.string());
  json tensors = json::object();
  int64_t offset = 0;
  for (const auto& [key, t] : batch.batch()) {
    Result<std::string> dtype = dtype_name(t.scalar_type());
    if (!dtype.ok()) return dtype.status().with_context(fmt::format("{}: batch key '{}'", what, key));
    // The driver's batch is on the host already (Note [Crossing the worker boundary]); this only
    // makes a strided tensor contiguous for the file.
    const at::Tensor host = t.to(at::kCPU).contiguous();
    const int64_t bytes = host.numel() * static_cast<int64_t>(host.element_size());
    out.write(static_cast<const char*>(host.data_ptr()), bytes);
    tensors[key] = {{"dtype", *dtype}, {"shape", host.sizes().vec()}, {"offset", offset}, {"count", host.numel()}};
    offset += bytes;
  }
  out.close();
  if (!out) return make_error(ErrorCode::io_error, "{}: cannot write '{}'", what, file.string());
  return tensors;
}

}  // namespace

Result<std::unique_ptr<PythonSampler>> PythonSampler::start(const json& cfg, int64_t dataset_size, int64_t batch_size) {
  TESSERA_ASSIGN_OR_RETURN(std::string path, config_get<std::string>(cfg, "data.sampler.class_path"));
  TESSERA_ASSIGN_OR_RETURN(auto name, config_get_or<std::optional<std::string>>(cfg, "data.sampler.class_name",
                                                                                  std::nullopt));
  if (!name || name->empty()) {
    return make_error(ErrorCode::invalid_argument, "data.sampler.class_name: required with data.sampler.class_path");
  }
  std::unique_ptr<PythonSampler> s(new PythonSampler());
  s->what_ = fmt::format("data.sampler.class_path ({} from {})", *name, path);
  s->dataset_size_ = dataset_size;
  s->batch_size_ = batch_size;
  // The dataset the sampler reads, built as verl's create_rl_dataset builds it.
  TESSERA_ASSIGN_OR_RETURN(json files, configured_data_files(cfg, "data.train_files"));
  // The data section as the user wrote it: verl's dataset and sampler both read it.
  const json& data = cfg.at("data");
  TESSERA_ASSIGN_OR_RETURN(auto tokenizer, config_get<std::optional<std::string>>(cfg, "data.tokenizer"));
  TESSERA_ASSIGN_OR_RETURN(std::string model, config_get<std::string>(cfg, "actor_rollout_ref.model.path"));
  TESSERA_ASSIGN_OR_RETURN(bool trust, config_get_or<bool>(cfg, "data.trust_remote_code", false));
  TESSERA_ASSIGN_OR_RETURN(auto dataset_path, config_get_or<std::optional<std::string>>(cfg, "data.custom_cls.path",
                                                                                          std::nullopt));
  TESSERA_ASSIGN_OR_RETURN(auto dataset_name, config_get_or<std::optional<std::string>>(cfg, "data.custom_cls.name",
                                                                                          std::nullopt));
  const json spec = {{"path", path},
                     {"name", *name},
                     {"tokenizer", tokenizer.value_or(model)},
                     {"trust_remote_code", trust},
                     {"config", data},
                     {"files", files},
                     {"dataset_path", dataset_path.value_or("")},
                     {"dataset_name", dataset_name.value_or("")}};
  TESSERA_ASSIGN_OR_RETURN(s->child_, runtime::spawn_python(runtime::python_from_env("TESSERA_DATA_PYTHON"),
                                                            std::string(kVerlDatasets) + kSamplerScript, {}, s->what_));
  TESSERA_RETURN_IF_ERROR(runtime::write_all(s->child_, spec.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                                             Clock::now() + std::chrono::minutes(1)));
  // Building the dataset tokenizes it (verl sets no limit).
  TESSERA_ASSIGN_OR_RETURN(json ready, s->call(json()));
  const json& size = ready.value("dataset_size", json()), &length = ready.value("length", json());
  if (!size.is_number_integer() || !length.is_number_integer()) {
    return make_error(ErrorCode::internal, "{}: the sampler process sent {}", s->what_, ready.dump().substr(0, 120));
  }
  if (size.get<int64_t>() != dataset_size) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: the dataset the sampler reads has {} rows but the training set has {} (data.train_files)",
                      s->what_, size.get<int64_t>(), dataset_size);
  }
  s->length_ = length.get<int64_t>();
  if (s->size() < 1) {
    return make_error(ErrorCode::invalid_argument, "{}: len(sampler) = {} is less than one batch of {} (data.gen_batch_size)",
                      s->what_, s->length_, batch_size);
  }
  s->curriculum_ = ready.value("curriculum", false);
  s->stateful_ = ready.value("stateful", false);
  return s;
}

PythonSampler::~PythonSampler() {
  if (child_.pid > 0) runtime::finish_child(child_, std::chrono::seconds(5));
}

// One request and its answer (an empty request: only read, the child's first message). After a
// call fails the sampler is broken: the child is gone and every later call gives that error.
Result<json> PythonSampler::call(const json& request) {
  if (!broken_.ok()) return broken_;
  Result<json> answer = exchange(request);
  if (!answer.ok()) {
    broken_ = answer.status();
    if (child_.pid > 0) runtime::kill_child(child_);
  }
  return answer;
}

Result<json> PythonSampler::exchange(const json& request) {
  if (!request.is_null()) {
    Status st = runtime::write_all(child_, request.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                                   Clock::now() + std::chrono::minutes(5));
    if (!st.ok()) return make_error(st.code(), "{}: the sampler process: {}", what_, st.message());
  }
  // The user's code runs in between (update() may do real work); no deadline, as verl has none.
  Result<std::string> line = runtime::read_line(child_, Clock::time_point::max());
  if (!line.ok()) return make_error(line.status().code(), "{}: the sampler process: {}", what_, line.status().message());
  json answer = json::parse(*line, nullptr, false);
  if (!answer.is_object()) {
    return make_error(ErrorCode::internal, "{}: the sampler process wrote '{}'", what_, runtime::first_line(*line).substr(0, 120));
  }
  for (const char* key : {"fatal", "error"}) {
    if (!answer.contains(key)) continue;
    const json& e = answer[key];
    return make_error(ErrorCode::invalid_argument, "{}: {}", what_, e.is_string() ? e.get<std::string>() : e.dump());
  }
  return answer;
}

Result<std::optional<std::vector<int64_t>>> PythonSampler::next() {
  if (!in_epoch_) {
    TESSERA_RETURN_IF_ERROR(call({{"op", "epoch"}, {"skip", skip_}}).status());
    in_epoch_ = true;
    skip_ = 0;
  }
  TESSERA_ASSIGN_OR_RETURN(json drawn, call({{"op", "draw"}, {"n", batch_size_}}));
  const json& indices = drawn.value("indices", json());
  if (!indices.is_array()) {
    return make_error(ErrorCode::internal, "{}: the sampler process sent {}", what_, drawn.dump().substr(0, 120));
  }
  if (static_cast<int64_t>(indices.size()) < batch_size_) {  // drop_last
    ++epoch_;
    batch_index_ = 0;
    in_epoch_ = false;
    return std::optional<std::vector<int64_t>>();
  }
  std::vector<int64_t> out;
  for (const json& i : indices) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= dataset_size_) {
      return make_error(ErrorCode::out_of_range, "{}: the sampler yielded index {} of a training set of {} rows", what_,
                        i.dump(), dataset_size_);
    }
    out.push_back(i.get<int64_t>());
  }
  ++batch_index_;
  return std::optional<std::vector<int64_t>>(std::move(out));
}

Status PythonSampler::update(const proto::DataProto& batch) {
  if (!curriculum_) return Status();
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("tessera-sampler-{}-{}.bin", ::getpid(), child_.pid);
  struct Remove {
    const std::filesystem::path& file;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    }
  } remove{file};
  TESSERA_ASSIGN_OR_RETURN(json tensors, write_tensors(batch, file, what_));
  json non_tensors = json::object();
  for (const auto& [key, column] : batch.non_tensor_batch()) non_tensors[key] = column.to_json();
  const json request = {{"op", "update"},
                        {"batch", {{"file", file.string()}, {"tensors", std::move(tensors)},
                                   {"non_tensors", std::move(non_tensors)}, {"meta_info", batch.meta_info()}}}};
  return call(request).status();
}

Result<json> PythonSampler::state_dict() {
  TESSERA_ASSIGN_OR_RETURN(json state, call({{"op", "state"}}));
  return json{{"class", what_},
              {"epoch", epoch_},
              {"yielded", batch_index_ * batch_size_},
              {"sampler_state", state.value("state", json())},
              {"epoch_state", in_epoch_ ? state.value("epoch_state", json()) : json()}};
}

Status PythonSampler::load_state_dict(const json& state) {
  const json& epoch = state.value("epoch", json()), &yielded = state.value("yielded", json());
  if (state.value("class", json()) != what_) {
    return make_error(ErrorCode::invalid_argument, "{}: the checkpoint's data order was drawn by {}; resume with that "
                      "data.sampler.class_path and data.sampler.class_name", what_, state.value("class", json()).dump());
  }
  if (!epoch.is_number_integer() || !yielded.is_number_integer() || epoch.get<int64_t>() < 0 ||
      yielded.get<int64_t>() < 0 || yielded.get<int64_t>() % batch_size_ != 0 ||
      yielded.get<int64_t>() / batch_size_ > size()) {
    return make_error(ErrorCode::corrupt_data,
                      "{}: the checkpoint's sampler position (epoch {}, {} indices taken) is not one of this run's "
                      "(data.gen_batch_size {})", what_, epoch.dump(), yielded.dump(), batch_size_);
  }
  const json& saved = state.value("sampler_state", json());
  if (saved.is_string()) {
    TESSERA_RETURN_IF_ERROR(call({{"op", "load"}, {"state", saved}, {"epoch_state", state.value("epoch_state", json())}})
                                .status());
  } else if (stateful_) {
    spdlog::warn("{}: the checkpoint holds no sampler state; the sampler starts afresh", what_);
  }
  epoch_ = epoch.get<int64_t>();
  batch_index_ = yielded.get<int64_t>() / batch_size_;
  in_epoch_ = false;
  skip_ = yielded.get<int64_t>();
  return Status();
}

}  // namespace tessera::driver
