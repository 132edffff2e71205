#include "proto/column.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace tessera::proto {
namespace {

using json = nlohmann::json;

[[noreturn]] void die(const char* msg, int64_t row, int64_t j) {
  std::fprintf(stderr, "tessera::proto::Column: %s (row %lld, value %lld)\n", msg,
               static_cast<long long>(row), static_cast<long long>(j));
  std::abort();
}

std::shared_ptr<const Column::Values> make_storage(Column::Values v) {
  return std::make_shared<const Column::Values>(std::move(v));
}

/// An empty vector of the same alternative as `like`.
Column::Values empty_like(const Column::Values& like) {
  return std::visit([](const auto& v) -> Column::Values { return std::decay_t<decltype(v)>{}; },
                    like);
}

template <class T>
bool value_equal(const T& a, const T& b) {
  if constexpr (std::is_same_v<T, double>) {
    return a == b || (std::isnan(a) && std::isnan(b));
  } else {
    return a == b;
  }
}

}  // namespace

const char* to_string(ColumnType type) {
  switch (type) {
    case ColumnType::string: return "string";
    case ColumnType::int64: return "int64";
    case ColumnType::float64: return "float64";
    case ColumnType::json: return "json";
  }
  return "unknown";
}

Column::Column(std::shared_ptr<const Values> storage, int64_t offset, int64_t rows,
               int64_t stride, int64_t width)
    : storage_(std::move(storage)),
      offset_(offset),
      rows_(rows),
      stride_(rows <= 1 ? 1 : stride),
      width_(width) {}

Column::Column() : Column(make_storage(std::vector<std::string>{}), 0, 0, 1, 1) {}

Column Column::strings(std::vector<std::string> values) {
  auto n = static_cast<int64_t>(values.size());
  return Column(make_storage(std::move(values)), 0, n, 1, 1);
}
Column Column::int64s(std::vector<int64_t> values) {
  auto n = static_cast<int64_t>(values.size());
  return Column(make_storage(std::move(values)), 0, n, 1, 1);
}
Column Column::doubles(std::vector<double> values) {
  auto n = static_cast<int64_t>(values.size());
  return Column(make_storage(std::move(values)), 0, n, 1, 1);
}
Column Column::jsons(std::vector<json> values) {
  auto n = static_cast<int64_t>(values.size());
  return Column(make_storage(std::move(values)), 0, n, 1, 1);
}

Result<Column> Column::from_values(Values values, int64_t width) {
  auto n = static_cast<int64_t>(std::visit([](const auto& v) { return v.size(); }, values));
  if (width < 1) return make_error(ErrorCode::invalid_argument, "Column: width {} < 1", width);
  if (n % width != 0) {
    return make_error(ErrorCode::invalid_argument, "Column: {} values are not divisible by width {}",
                      n, width);
  }
  return Column(make_storage(std::move(values)), 0, n / width, 1, width);
}

Result<Column> Column::from_json(const json& array, ColumnType type) {
  if (!array.is_array()) {
    return make_error(ErrorCode::invalid_argument, "Column::from_json: expected a JSON array, got {}",
                      array.type_name());
  }
  auto bad = [&](size_t i) {
    return make_error(ErrorCode::invalid_argument, "Column::from_json: row {} is a {}, not {}", i,
                      array[i].type_name(), to_string(type));
  };
  switch (type) {
    case ColumnType::string: {
      std::vector<std::string> v;
      for (size_t i = 0; i < array.size(); ++i) {
        if (!array[i].is_string()) return bad(i);
        v.push_back(array[i].get<std::string>());
      }
      return strings(std::move(v));
    }
    case ColumnType::int64: {
      std::vector<int64_t> v;
      for (size_t i = 0; i < array.size(); ++i) {
        const json& x = array[i];
        if (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX)) return bad(i);
        if (!x.is_number_integer()) return bad(i);
        v.push_back(x.get<int64_t>());
      }
      return int64s(std::move(v));
    }
    case ColumnType::float64: {
      std::vector<double> v;
      for (size_t i = 0; i < array.size(); ++i) {
        if (!array[i].is_number()) return bad(i);
        v.push_back(array[i].get<double>());
      }
      return doubles(std::move(v));
    }
    case ColumnType::json:
      return jsons(std::vector<json>(array.begin(), array.end()));
  }
  return make_error(ErrorCode::invalid_argument, "Column::from_json: unknown column type");
}

ColumnType Column::type() const { return static_cast<ColumnType>(storage_->index()); }

void Column::check_access(ColumnType type, int64_t row, int64_t j) const {
  if (this->type() != type) die("typed access with the wrong type", row, j);
  if (row < 0 || row >= rows_ || j < 0 || j >= width_) die("index out of range", row, j);
}

const std::string& Column::str(int64_t row, int64_t j) const {
  check_access(ColumnType::string, row, j);
  return std::get<std::vector<std::string>>(*storage_)[element_index(row, j)];
}
int64_t Column::i64(int64_t row, int64_t j) const {
  check_access(ColumnType::int64, row, j);
  return std::get<std::vector<int64_t>>(*storage_)[element_index(row, j)];
}
double Column::f64(int64_t row, int64_t j) const {
  check_access(ColumnType::float64, row, j);
  return std::get<std::vector<double>>(*storage_)[element_index(row, j)];
}
const json& Column::json_value(int64_t row, int64_t j) const {
  check_access(ColumnType::json, row, j);
  return std::get<std::vector<json>>(*storage_)[element_index(row, j)];
}

json Column::row_json(int64_t row) const {
  if (row < 0 || row >= rows_) die("row_json: index out of range", row, 0);
  return std::visit(
      [&](const auto& v) -> json {
        if (width_ == 1) return json(v[element_index(row, 0)]);
        json out = json::array();
        for (int64_t j = 0; j < width_; ++j) out.push_back(v[element_index(row, j)]);
        return out;
      },
      *storage_);
}

json Column::to_json() const {
  json out = json::array();
  for (int64_t r = 0; r < rows_; ++r) out.push_back(row_json(r));
  return out;
}

Column Column::view(int64_t start, int64_t count, int64_t step) const {
  if (count < 0 || step < 1 || start < 0 || start > rows_ ||
      (count > 0 && start + (count - 1) * step >= rows_)) {
    die("view: rows out of range", start, count);
  }
  // An empty view keeps the position where it starts, so an empty chunk stays adjacent.
  return Column(storage_, element_index(start, 0), count, stride_ * step, width_);
}

Column Column::take(const std::vector<int64_t>& rows) const {
  Values out = std::visit(
      [&](const auto& v) -> Values {
        std::decay_t<decltype(v)> dst;
        dst.reserve(rows.size() * static_cast<size_t>(width_));
        for (int64_t r : rows) {
          if (r < 0 || r >= rows_) die("take: index out of range", r, 0);
          for (int64_t j = 0; j < width_; ++j) dst.push_back(v[element_index(r, j)]);
        }
        return dst;
      },
      *storage_);
  return Column(make_storage(std::move(out)), 0, static_cast<int64_t>(rows.size()), 1, width_);
}

Column Column::compact() const {
  std::vector<int64_t> all(static_cast<size_t>(rows_));
  for (int64_t r = 0; r < rows_; ++r) all[static_cast<size_t>(r)] = r;
  return take(all);
}

Column Column::fold(int64_t factor) const {
  if (factor < 1 || rows_ % factor != 0) die("fold: rows not divisible by factor", rows_, factor);
  if (stride_ != 1) return compact().fold(factor);
  return Column(storage_, offset_, rows_ / factor, 1, width_ * factor);
}

Column Column::unfold() const {
  if (stride_ != 1) return compact().unfold();
  return Column(storage_, offset_, rows_ * width_, 1, 1);
}

Result<Column> Column::concat(const std::vector<Column>& parts) {
  if (parts.empty()) return make_error(ErrorCode::invalid_argument, "Column::concat: no columns");
  const Column& first = parts.front();
  bool adjacent = true;
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Column& p = parts[i];
    if (p.type() != first.type() || p.width_ != first.width_) {
      return make_error(ErrorCode::invalid_argument,
                        "Column::concat: part {} is {} of width {}, part 0 is {} of width {}", i,
                        to_string(p.type()), p.width_, to_string(first.type()), first.width_);
    }
    // Note [Zero-copy chunk/concat]: views are adjacent when each starts where the previous ends.
    if (i > 0) {
      const Column& prev = parts[i - 1];
      adjacent = adjacent && p.storage_ == first.storage_ && prev.stride_ == 1 &&
                 p.offset_ == prev.offset_ + prev.rows_ * prev.width_;
    }
    rows += p.rows_;
  }
  adjacent = adjacent && parts.back().stride_ == 1;
  if (adjacent) return Column(first.storage_, first.offset_, rows, 1, first.width_);
  Values out = empty_like(*first.storage_);
  std::visit(
      [&](auto& dst) {
        using Vec = std::decay_t<decltype(dst)>;
        dst.reserve(static_cast<size_t>(rows * first.width_));
        for (const Column& p : parts) {
          const Vec& src = std::get<Vec>(*p.storage_);
          for (int64_t r = 0; r < p.rows_; ++r) {
            for (int64_t j = 0; j < p.width_; ++j) dst.push_back(src[p.element_index(r, j)]);
          }
        }
      },
      out);
  return Column(make_storage(std::move(out)), 0, rows, 1, first.width_);
}

bool Column::equals(const Column& other) const {
  if (type() != other.type() || rows_ != other.rows_ || width_ != other.width_) return false;
  return std::visit(
      [&](const auto& a) {
        using Vec = std::decay_t<decltype(a)>;
        const Vec& b = std::get<Vec>(*other.storage_);
        for (int64_t r = 0; r < rows_; ++r) {
          for (int64_t j = 0; j < width_; ++j) {
            if (!value_equal(a[element_index(r, j)], b[other.element_index(r, j)])) return false;
          }
        }
        return true;
      },
      *storage_);
}

}  // namespace tessera::proto
