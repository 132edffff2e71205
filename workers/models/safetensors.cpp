// safetensors.cpp: single-file read (mmap, validated header) and atomic write.
#include "workers/models/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "proto/atomic_file.hpp"

namespace tessera::models {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

struct DtypeRow {
  const char* name;
  c10::ScalarType type;
  uint64_t itemsize;
};

const DtypeRow kDtypes[] = {
    {"F64", c10::ScalarType::Double, 8}, {"F32", c10::ScalarType::Float, 4},
    {"F16", c10::ScalarType::Half, 2},   {"BF16", c10::ScalarType::BFloat16, 2},
    {"I64", c10::ScalarType::Long, 8},   {"I32", c10::ScalarType::Int, 4},
    {"I16", c10::ScalarType::Short, 2},  {"I8", c10::ScalarType::Char, 1},
    {"U8", c10::ScalarType::Byte, 1},    {"BOOL", c10::ScalarType::Bool, 1},
};

const DtypeRow* find_dtype(const std::string& name) {
  for (const auto& row : kDtypes) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

// A private, copy-on-write mapping of a whole file; unmapped when the last tensor lets go.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return make_error(ErrorCode::not_found, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return make_error(ErrorCode::io_error, "{}: not a regular file", path);
    }
    auto file = std::shared_ptr<MappedFile>(new MappedFile());
    file->size_ = static_cast<uint64_t>(st.st_size);
    if (file->size_ > 0) {
      void* p = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return make_error(ErrorCode::io_error, "{}: mmap failed: {}", path, std::strerror(errno));
      }
      file->data_ = static_cast<uint8_t*>(p);
    }
    ::close(fd);
    return file;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

struct Entry {
  std::string name;
  const DtypeRow* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Status entry_error(const std::string& path, const std::string& name, const std::string& what) {
  return make_error(ErrorCode::corrupt_data, "{}: tensor '{}': {}", path, name, what);
}

bool read_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return false;
  out = v.get<uint64_t>();
  return true;
}

Result<uint64_t> parse_shape(const std::string& path, const std::string& name, const json& shape,
                             std::vector<int64_t>& out) {
  if (!shape.is_array()) return entry_error(path, name, "'shape' is not a list");
  uint64_t numel = 1;
  for (const json& d : shape) {
    uint64_t dim = 0;
    if (!read_u64(d, dim) || dim > uint64_t{INT64_MAX}) return entry_error(path, name, "bad dimension " + d.dump());
    if (__builtin_mul_overflow(numel, dim, &numel)) return entry_error(path, name, "shape overflows");
    out.push_back(static_cast<int64_t>(dim));
  }
  return numel;
}

Result<Entry> parse_entry(const std::string& path, const std::string& name, const json& v, uint64_t data_size) {
  Entry e;
  e.name = name;
  if (name.empty()) return entry_error(path, name, "empty tensor name");
  if (!v.is_object()) return entry_error(path, name, "entry is not an object");
  if (!v.contains("dtype") || !v["dtype"].is_string()) return entry_error(path, name, "missing 'dtype'");
  e.dtype = find_dtype(v["dtype"].get<std::string>());
  if (e.dtype == nullptr) return entry_error(path, name, "unknown dtype '" + v["dtype"].get<std::string>() + "'");
  if (!v.contains("shape")) return entry_error(path, name, "missing 'shape'");
  TESSERA_ASSIGN_OR_RETURN(uint64_t numel, parse_shape(path, name, v["shape"], e.shape));
  const json* offs = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
  if (offs == nullptr || !offs->is_array() || offs->size() != 2 || !read_u64((*offs)[0], e.begin) ||
      !read_u64((*offs)[1], e.end)) {
    return entry_error(path, name, "'data_offsets' must be two non-negative integers");
  }
  if (e.begin > e.end) return entry_error(path, name, fmt::format("data_offsets [{}, {}] are reversed", e.begin, e.end));
  if (e.end > data_size) {
    return entry_error(path, name, fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes)",
                                               e.begin, e.end, data_size));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, e.dtype->itemsize, &bytes) || bytes != e.end - e.begin) {
    return entry_error(path, name, fmt::format("shape {} x {} bytes does not match data_offsets [{}, {}]",
                                               v["shape"].dump(), e.dtype->itemsize, e.begin, e.end));
  }
  return e;
}

// The data must be tiled exactly: sorted by begin, each tensor starts where the previous ended.
Status check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < cursor) {
      return entry_error(path, e.name, fmt::format("data_offsets [{}, {}] overlap tensor '{}'", e.begin, e.end,
                                                   prev != nullptr ? prev->name : std::string("?")));
    }
    if (e.begin > cursor) {
      return entry_error(path, e.name, fmt::format("data_offsets start at {} leaving a hole after byte {}",
                                                   e.begin, cursor));
    }
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size) {
    return make_error(ErrorCode::corrupt_data, "{}: {} bytes of data after the last tensor", path, data_size - cursor);
  }
  return Status();
}

Status parse_metadata(const std::string& path, const json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) return make_error(ErrorCode::corrupt_data, "{}: '__metadata__' is not an object", path);
  for (const auto& [k, s] : v.items()) {
    if (!s.is_string()) return make_error(ErrorCode::corrupt_data, "{}: '__metadata__.{}' is not a string", path, k);
    out[k] = s.get<std::string>();
  }
  return Status();
}

Result<uint64_t> header_length(const std::string& path, const MappedFile& file) {
  if (file.size() < 8) {
    return make_error(ErrorCode::corrupt_data, "{}: truncated: {} bytes, shorter than the 8-byte header length",
                      path, file.size());
  }
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);  // little-endian host (x86-64, aarch64)
  if (n > file.size() - 8) {
    return make_error(ErrorCode::corrupt_data, "{}: header length {} runs past the end of the file ({} bytes)",
                      path, n, file.size());
  }
  if (n > kMaxHeaderBytes) return make_error(ErrorCode::corrupt_data, "{}: header length {} exceeds 100 MiB", path, n);
  return n;
}

Result<std::vector<Entry>> parse_header(const std::string& path, const MappedFile& file, uint64_t n,
                                        std::map<std::string, std::string>& metadata) {
  const char* begin = reinterpret_cast<const char*>(file.data()) + 8;
  json header = json::parse(begin, begin + n, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return make_error(ErrorCode::corrupt_data, "{}: header is not a JSON object", path);
  }
  uint64_t data_size = file.size() - 8 - n;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      TESSERA_RETURN_IF_ERROR(parse_metadata(path, v, metadata));
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(Entry e, parse_entry(path, name, v, data_size));
    entries.push_back(std::move(e));
  }
  TESSERA_RETURN_IF_ERROR(check_tiling(path, entries, data_size));
  return entries;
}

at::Tensor make_tensor(const std::shared_ptr<MappedFile>& file, uint64_t data_start, const Entry& e) {
  auto options = at::TensorOptions().dtype(e.dtype->type);
  uint8_t* ptr = file->data() + data_start + e.begin;
  if (reinterpret_cast<uintptr_t>(ptr) % e.dtype->itemsize != 0) {
    // Misaligned (legal in the format, never written by us): copy into aligned memory.
    at::Tensor t = at::empty(e.shape, options);
    std::memcpy(t.data_ptr(), ptr, e.end - e.begin);
    return t;
  }
  std::shared_ptr<MappedFile> keep = file;
  return at::from_blob(ptr, e.shape, [keep](void*) mutable { keep.reset(); }, options);
}

struct Item {
  const std::string* name;
  at::Tensor data;  // contiguous CPU
  const char* dtype;
  uint64_t itemsize;
};

Result<std::vector<Item>> prepare_items(const std::string& path, const TensorMap& tensors) {
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) return entry_error(path, name, "undefined tensor");
    const DtypeRow* row = nullptr;
    for (const auto& r : kDtypes) {
      if (r.type == t.scalar_type()) row = &r;
    }
    if (row == nullptr) return entry_error(path, name, std::string("dtype ") + c10::toString(t.scalar_type()) + " not supported");
    items.push_back({&name, t.detach().to(at::kCPU).contiguous(), row->name, row->itemsize});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.itemsize > b.itemsize; });
  return items;
}

std::string build_header(const std::vector<Item>& items, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Item& it : items) {
    uint64_t bytes = it.data.nbytes();
    header[*it.name] = {{"dtype", it.dtype}, {"shape", it.data.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

Result<SafetensorsContents> read_safetensors(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::open(path));
  TESSERA_ASSIGN_OR_RETURN(uint64_t n, header_length(path, *file));
  SafetensorsContents out;
  TESSERA_ASSIGN_OR_RETURN(std::vector<Entry> entries, parse_header(path, *file, n, out.metadata));
  for (const Entry& e : entries) out.tensors.emplace(e.name, make_tensor(file, 8 + n, e));
  return out;
}

Status write_safetensors(const std::string& path, const TensorMap& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<Item> items;
  try {
    TESSERA_ASSIGN_OR_RETURN(items, prepare_items(path, tensors));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{}: cannot prepare tensors: {}", path, e.what());
  }
  std::string header = build_header(items, metadata);
  uint64_t n = header.size();
  proto::AtomicFileWriter w;
  TESSERA_RETURN_IF_ERROR(w.open(path));
  TESSERA_RETURN_IF_ERROR(w.write(&n, 8));
  TESSERA_RETURN_IF_ERROR(w.write(header.data(), header.size()));
  for (const Item& it : items) TESSERA_RETURN_IF_ERROR(w.write(it.data.data_ptr(), it.data.nbytes()));
  return w.commit();
}

Result<std::string> safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& r : kDtypes) {
    if (r.type == dtype) return std::string(r.name);
  }
  return make_error(ErrorCode::invalid_argument, "dtype {} has no safetensors name", c10::toString(dtype));
}

}  // namespace tessera::models
