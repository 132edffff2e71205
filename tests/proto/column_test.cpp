// Column: typed values, views, gathers, O(1) concat of adjacent views, NaN-aware equality.
#include <cmath>
#include <limits>

#include "proto/column.hpp"
#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;

TEST(Column, FactoriesAndTypedAccess) {
  Column s = Column::strings({"a", "bc"});
  Column i = Column::int64s({std::numeric_limits<int64_t>::min(), 7});
  Column d = Column::doubles({1.5, -2.0});
  Column j = Column::jsons({json{{"k", 1}}, json::array({1, 2})});
  EXPECT_EQ(s.type(), ColumnType::string);
  EXPECT_EQ(s.size(), 2);
  EXPECT_EQ(s.str(1), "bc");
  EXPECT_EQ(i.i64(0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(d.f64(1), -2.0);
  EXPECT_EQ(j.json_value(0)["k"], 1);
  EXPECT_EQ(j.to_json(), json::array({json{{"k", 1}}, json::array({1, 2})}));
  EXPECT_EQ(Column().size(), 0);
  EXPECT_STREQ(to_string(ColumnType::float64), "float64");
}

TEST(Column, FromJsonChecksEveryRow) {
  auto ok = unwrap(Column::from_json(json::array({1, 2, 3}), ColumnType::int64));
  EXPECT_EQ(ok.i64(2), 3);
  auto dbl = unwrap(Column::from_json(json::array({1, 2.5}), ColumnType::float64));
  EXPECT_EQ(dbl.f64(0), 1.0);
  expect_error(Column::from_json(json::array({"a", 3}), ColumnType::string), ErrorCode::invalid_argument,
               "row 1");
  expect_error(Column::from_json(json::array({1, 2.5}), ColumnType::int64), ErrorCode::invalid_argument,
               "row 1");
  expect_error(Column::from_json(json{{"a", 1}}, ColumnType::json), ErrorCode::invalid_argument,
               "array");
}

TEST(Column, FromValuesWidth) {
  auto c = unwrap(Column::from_values(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, 3));
  EXPECT_EQ(c.size(), 2);
  EXPECT_EQ(c.width(), 3);
  EXPECT_EQ(c.i64(1, 0), 3);
  EXPECT_EQ(c.row_json(1), json::array({3, 4, 5}));
  expect_error(Column::from_values(std::vector<int64_t>{0, 1, 2}, 2), ErrorCode::invalid_argument,
               "divisible");
  expect_error(Column::from_values(std::vector<int64_t>{}, 0), ErrorCode::invalid_argument, "width");
}

TEST(Column, ViewSharesStorage) {
  Column c = Column::int64s({0, 1, 2, 3, 4, 5, 6, 7});
  Column v = c.view(2, 3);
  EXPECT_EQ(v.storage_id(), c.storage_id());
  EXPECT_EQ(v.storage_offset(), 2);
  EXPECT_EQ(v.i64(0), 2);
  EXPECT_EQ(v.i64(2), 4);
  Column strided = c.view(1, 3, 3);  // rows 1, 4, 7
  EXPECT_EQ(strided.storage_id(), c.storage_id());
  EXPECT_EQ(strided.to_json(), json::array({1, 4, 7}));
  Column nested = strided.view(1, 2);  // rows 4, 7
  EXPECT_EQ(nested.to_json(), json::array({4, 7}));
}

TEST(Column, TakeCopies) {
  Column c = Column::strings({"a", "b", "c"});
  Column t = c.take({2, 0, 2});
  EXPECT_NE(t.storage_id(), c.storage_id());
  EXPECT_EQ(t.to_json(), json::array({"c", "a", "c"}));
  Column compact = c.view(1, 2).compact();
  EXPECT_NE(compact.storage_id(), c.storage_id());
  EXPECT_EQ(compact.storage_offset(), 0);
  EXPECT_EQ(compact.to_json(), json::array({"b", "c"}));
}

TEST(Column, ConcatOfAdjacentViewsIsZeroCopy) {
  Column c = Column::doubles({0, 1, 2, 3, 4, 5});
  Column joined = unwrap(Column::concat({c.view(0, 2), c.view(2, 2), c.view(4, 2)}));
  EXPECT_EQ(joined.storage_id(), c.storage_id());
  EXPECT_EQ(joined.storage_offset(), 0);
  EXPECT_TRUE(joined.equals(c));
  // An empty view in the middle keeps adjacency.
  Column with_empty = unwrap(Column::concat({c.view(0, 3), c.view(3, 0), c.view(3, 3)}));
  EXPECT_EQ(with_empty.storage_id(), c.storage_id());
}

TEST(Column, ConcatOfOtherViewsCopies) {
  Column c = Column::int64s({0, 1, 2, 3});
  Column joined = unwrap(Column::concat({c.view(2, 2), c.view(0, 2)}));
  EXPECT_NE(joined.storage_id(), c.storage_id());
  EXPECT_EQ(joined.to_json(), json::array({2, 3, 0, 1}));
  Column other = Column::int64s({9});
  EXPECT_EQ(unwrap(Column::concat({c, other})).to_json(), json::array({0, 1, 2, 3, 9}));
}

TEST(Column, ConcatErrors) {
  expect_error(Column::concat({}), ErrorCode::invalid_argument, "no columns");
  expect_error(Column::concat({Column::int64s({1}), Column::strings({"a"})}), ErrorCode::invalid_argument,
               "part 1");
  auto wide = unwrap(Column::from_values(std::vector<int64_t>{1, 2}, 2));
  expect_error(Column::concat({Column::int64s({1}), wide}), ErrorCode::invalid_argument, "width");
}

TEST(Column, EqualsIsNanAware) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(Column::doubles({1.0, nan}).equals(Column::doubles({1.0, nan})));
  EXPECT_FALSE(Column::doubles({1.0, nan}).equals(Column::doubles({1.0, 2.0})));
  EXPECT_FALSE(Column::int64s({1}).equals(Column::doubles({1.0})));
  EXPECT_FALSE(Column::strings({"a"}).equals(Column::strings({"a", "b"})));
  EXPECT_TRUE(Column::jsons({json{{"a", 1}}}).equals(Column::jsons({json{{"a", 1}}})));
}

TEST(Column, FoldAndUnfold) {
  Column c = Column::strings({"a", "b", "c", "d", "e", "f"});
  Column f = c.fold(3);
  EXPECT_EQ(f.size(), 2);
  EXPECT_EQ(f.width(), 3);
  EXPECT_EQ(f.storage_id(), c.storage_id());
  EXPECT_EQ(f.row_json(1), json::array({"d", "e", "f"}));
  EXPECT_TRUE(f.unfold().equals(c));
  Column strided = c.view(0, 3, 2);  // a, c, e: folding a strided view copies
  Column fs = strided.fold(3);
  EXPECT_EQ(fs.row_json(0), json::array({"a", "c", "e"}));
}

}  // namespace
}  // namespace tessera::proto
