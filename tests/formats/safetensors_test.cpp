// SafetensorsFile: reading well-formed files of every dtype, and one test per kind of malformed file, each checking
// that the Error names the file, the tensor where there is one, and the specific problem.
#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "expect_error.h"
#include "safetensors_builder.h"

namespace kestrel {
namespace {

using testing::expect_error;
using testing::SafetensorsBuilder;
using testing::ScratchDir;

class SafetensorsTest : public ::testing::Test {
protected:
  // Writes `builder` to model.safetensors in the scratch dir and returns the path.
  std::string write(const SafetensorsBuilder& builder) {
    builder.write(path_);
    return path_;
  }
  // Opens a file built from `builder` and expects an Error naming the file and every fragment.
  void expect_rejected(const SafetensorsBuilder& builder, std::initializer_list<std::string_view> fragments) {
    write(builder);
    const std::string message = expect_error([&] { SafetensorsFile file(path_); }, fragments);
    EXPECT_TRUE(message.starts_with(path_ + ": ")) << message;
  }
  // A builder with one valid F32 [2, 2] tensor "a" plus an entry "b" whose header value is `raw_entry`.
  static SafetensorsBuilder with_raw_entry(std::string raw_entry) {
    SafetensorsBuilder builder;
    builder.add_values<float>("a", "F32", {2, 2}, {1, 2, 3, 4});
    builder.add_tensor(
        {.name = "b", .dtype = "", .shape = {}, .bytes = {}, .data_offsets = {}, .raw_entry = std::move(raw_entry)});
    return builder;
  }

  ScratchDir dir_;
  std::string path_ = dir_.file("model.safetensors");
};

TEST_F(SafetensorsTest, ReadsEveryDtype) {
  SafetensorsBuilder builder;
  builder.add_values<double>("f64", "F64", {2}, {1.5, -2.25})
      .add_values<float>("f32", "F32", {2, 3}, {0, 1, 2, 3, 4, 5})
      .add_values<uint16_t>("f16", "F16", {3}, {f32_to_f16(1.0f), f32_to_f16(-2.0f), f32_to_f16(0.5f)})
      .add_values<uint16_t>("bf16", "BF16", {1, 2}, {f32_to_bf16(3.0f), f32_to_bf16(-0.125f)})
      .add_values<uint8_t>("fp8", "F8_E4M3", {4}, {0x38, 0x40, 0x7e, 0xb8})
      .add_values<uint8_t>("e5m2", "F8_E5M2", {1}, {0x3c})
      .add_values<int64_t>("i64", "I64", {1}, {-(int64_t{1} << 40)})
      .add_values<int32_t>("i32", "I32", {2}, {-7, 154820})
      .add_values<int16_t>("i16", "I16", {1}, {-300})
      .add_values<int8_t>("i8", "I8", {2}, {-1, 1})
      .add_values<uint8_t>("u8", "U8", {3}, {0, 128, 255})
      .add_values<uint8_t>("bool", "BOOL", {2}, {0, 1});
  const SafetensorsFile file(write(builder));

  EXPECT_EQ(file.path(), path_);
  ASSERT_EQ(file.tensors().size(), 12u);
  for (const auto& expected : builder.tensors()) {
    const TensorView* tensor = file.find(expected.name);
    ASSERT_NE(tensor, nullptr) << expected.name;
    EXPECT_EQ(dtype_name(tensor->dtype), expected.dtype);
    EXPECT_EQ(tensor->shape, expected.shape);
    ASSERT_EQ(tensor->nbytes, expected.bytes.size());
    EXPECT_EQ(std::memcmp(tensor->data, expected.bytes.data(), tensor->nbytes), 0) << expected.name;
    EXPECT_EQ(tensor->path, &file.path());
  }
  const TensorView& f32 = *file.find("f32");
  EXPECT_EQ(f32.numel(), 6);
  EXPECT_EQ(f32.shape_string(), "[2, 3]");
  float last;
  std::memcpy(&last, f32.data + 5 * sizeof(float), sizeof last);
  EXPECT_EQ(last, 5.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(file.find("fp8")->data[2])), 448.0f);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_TRUE(file.metadata().empty());
}

TEST_F(SafetensorsTest, TensorsAreListedByName) {
  SafetensorsBuilder builder;
  builder.add_values<float>("z", "F32", {1}, {1}).add_values<float>("a", "F32", {1}, {2});
  const SafetensorsFile file(write(builder));
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[0].name, "a");
  EXPECT_EQ(file.tensors()[1].name, "z");
}

TEST_F(SafetensorsTest, ReadsMetadata) {
  SafetensorsBuilder builder;
  builder.metadata("format", "pt").metadata("note", "x").add_values<float>("w", "F32", {1}, {1});
  const SafetensorsFile file(write(builder));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "x");
  EXPECT_EQ(file.tensors().size(), 1u);
}

TEST_F(SafetensorsTest, ZeroSizeAndScalarTensors) {
  SafetensorsBuilder builder;
  builder.add("empty", "F32", {0}, "")
      .add("empty2d", "BF16", {3, 0}, "")
      .add_values<float>("scalar", "F32", {}, {7})
      .add("empty_last", "I32", {0, 5}, "");
  const SafetensorsFile file(write(builder));
  EXPECT_EQ(file.find("empty")->numel(), 0);
  EXPECT_EQ(file.find("empty")->nbytes, 0u);
  EXPECT_EQ(file.find("empty2d")->shape_string(), "[3, 0]");
  EXPECT_EQ(file.find("scalar")->numel(), 1);
  EXPECT_EQ(file.find("scalar")->shape_string(), "[]");
  EXPECT_EQ(file.find("empty_last")->nbytes, 0u);
}

TEST_F(SafetensorsTest, NegativeZeroIsAValidDimensionAndOffset) {
  const SafetensorsFile file(write(with_raw_entry(R"({"dtype": "F32", "shape": [-0], "data_offsets": [-0, 0]})")));
  EXPECT_EQ(file.find("b")->numel(), 0);
}

TEST_F(SafetensorsTest, HeaderOnlyFileWithNoTensors) {
  const SafetensorsFile file(write(SafetensorsBuilder()));
  EXPECT_TRUE(file.tensors().empty());
}

TEST_F(SafetensorsTest, EmptyTensorInsideAnotherRangeIsNotAnOverlap) {
  SafetensorsBuilder builder;
  builder.add_values<float>("a", "F32", {4}, {1, 2, 3, 4});
  builder.add_tensor(
      {.name = "empty", .dtype = "F32", .shape = {0}, .bytes = {}, .data_offsets = {{8, 8}}, .raw_entry = {}});
  const SafetensorsFile file(write(builder));
  EXPECT_EQ(file.find("empty")->nbytes, 0u);
}

// Malformed files.

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthPrefix) {
  SafetensorsBuilder builder;
  builder.corrupt().truncate_to = 5;
  expect_rejected(builder, {"file is 5 bytes", "8-byte header length"});
}

TEST_F(SafetensorsTest, RejectsEmptyFile) {
  SafetensorsBuilder builder;
  builder.corrupt().truncate_to = 0;
  expect_rejected(builder, {"file is 0 bytes"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  SafetensorsBuilder builder;
  builder.add_values<float>("a", "F32", {1}, {1});
  builder.corrupt().header_length = 4096;
  expect_rejected(builder, {"header length 4096 exceeds the"});
}

TEST_F(SafetensorsTest, RejectsAbsurdHeaderLength) {
  SafetensorsBuilder builder;
  builder.corrupt().header_length = uint64_t{1} << 40;
  expect_rejected(builder, {"header length 1099511627776", "MiB limit"});
}

TEST_F(SafetensorsTest, RejectsMaximalHeaderLengthWithoutOverflow) {
  SafetensorsBuilder builder;
  builder.corrupt().header_length = UINT64_MAX;
  expect_rejected(builder, {"header length 18446744073709551615"});
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  SafetensorsBuilder builder;
  builder.corrupt().header = "{\"a\": {\"dtype\": \"F32\",";
  expect_rejected(builder, {"invalid JSON"});
}

TEST_F(SafetensorsTest, RejectsEmptyHeader) {
  SafetensorsBuilder builder;
  builder.corrupt().header = "";
  expect_rejected(builder, {"invalid JSON"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  SafetensorsBuilder builder;
  builder.corrupt().header = "[1, 2, 3]";
  expect_rejected(builder, {"expected a JSON object, got array"});
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  SafetensorsBuilder builder;
  builder.corrupt().header = "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}";
  expect_rejected(builder, {"nested deeper than 64 levels"});
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  expect_rejected(with_raw_entry("[1, 2]"), {"tensor 'b'", "expected an object", "got array"});
}

TEST_F(SafetensorsTest, RejectsMissingDtype) {
  expect_rejected(with_raw_entry(R"({"shape": [0], "data_offsets": [16, 16]})"), {"tensor 'b'", "missing 'dtype'"});
}

TEST_F(SafetensorsTest, RejectsMissingShape) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "data_offsets": [16, 16]})"), {"tensor 'b'", "missing 'shape'"});
}

TEST_F(SafetensorsTest, RejectsMissingDataOffsets) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [0]})"), {"tensor 'b'", "missing 'data_offsets'"});
}

TEST_F(SafetensorsTest, RejectsDtypeThatIsNotAString) {
  expect_rejected(with_raw_entry(R"({"dtype": 4, "shape": [0], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "'dtype' must be a string"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  SafetensorsBuilder builder;
  builder.add("w.weight", "F4", {2}, "x");
  expect_rejected(builder, {"tensor 'w.weight'", "unknown dtype 'F4'"});
}

TEST_F(SafetensorsTest, RejectsLowercaseDtype) {
  SafetensorsBuilder builder;
  builder.add_values<float>("w", "f32", {1}, {1});
  expect_rejected(builder, {"tensor 'w'", "unknown dtype 'f32'"});
}

TEST_F(SafetensorsTest, RejectsShapeThatIsNotAnArray) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": 4, "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "'shape' must be an array"});
}

TEST_F(SafetensorsTest, RejectsFractionalDimension) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [1, 1.5], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "shape[1] is not an integer"});
}

TEST_F(SafetensorsTest, RejectsStringDimension) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": ["2"], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "shape[0] is not an integer"});
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [-1, 0], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "shape[0] is negative: -1"});
}

TEST_F(SafetensorsTest, RejectsElementCountOverflow) {
  expect_rejected(
      with_raw_entry(R"({"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [16, 16]})"),
      {"tensor 'b'", "more than 2^63 elements"});
}

TEST_F(SafetensorsTest, RejectsDimsWhoseProductWrapsToZero) {
  // 2^32 * 2^32 wraps to 0 in 64 bits and would match an empty range if unchecked.
  expect_rejected(with_raw_entry(R"({"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "more than 2^63 elements"});
}

TEST_F(SafetensorsTest, RejectsDimensionBeyondInt64) {
  expect_rejected(with_raw_entry(R"({"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "more than 2^63 elements"});
}

TEST_F(SafetensorsTest, RejectsByteCountOverflow) {
  // 2^62 elements fit in int64, but 8 bytes each do not fit in 64 bits.
  expect_rejected(with_raw_entry(R"({"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [16, 16]})"),
                  {"tensor 'b'", "needs more than 2^64 bytes"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsThatAreNotAPair) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [0], "data_offsets": [16]})"),
                  {"tensor 'b'", "'data_offsets' must be [begin, end]"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsThatAreNotAnArray) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [0], "data_offsets": "16"})"),
                  {"tensor 'b'", "'data_offsets' must be [begin, end]"});
}

TEST_F(SafetensorsTest, RejectsNegativeDataOffsets) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [0], "data_offsets": [-4, 0]})"),
                  {"tensor 'b'", "two non-negative integers"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsBeyondUint64) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "shape": [0], "data_offsets": [0, 1e30]})"),
                  {"tensor 'b'", "two non-negative integers"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsEndingBeforeTheyBegin) {
  SafetensorsBuilder builder;
  builder.add_tensor({.name = "a",
                      .dtype = "F32",
                      .shape = {1},
                      .bytes = std::string(4, '\0'),
                      .data_offsets = {{4, 0}},
                      .raw_entry = {}});
  expect_rejected(builder, {"tensor 'a'", "data_offsets [4, 0] end before they begin"});
}

TEST_F(SafetensorsTest, RejectsDataOffsetsBeyondDataSection) {
  SafetensorsBuilder builder;
  builder.add_tensor({.name = "a.weight",
                      .dtype = "F32",
                      .shape = {25},
                      .bytes = std::string(64, '\0'),
                      .data_offsets = {{0, 100}},
                      .raw_entry = {}});
  expect_rejected(builder, {"tensor 'a.weight': data_offsets [0, 100] exceed the data section (64 bytes)"});
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  SafetensorsBuilder builder;
  builder.add_values<float>("a", "F32", {4}, {1, 2, 3, 4});
  builder.corrupt().truncate_to = builder.build().size() - 1;
  expect_rejected(builder, {"tensor 'a'", "data_offsets [0, 16] exceed the data section (15 bytes)"});
}

TEST_F(SafetensorsTest, RejectsSizeThatDoesNotMatchShape) {
  SafetensorsBuilder builder;
  builder.add("a", "F32", {4}, std::string(8, '\0'));
  expect_rejected(builder, {"tensor 'a'", "span 8 bytes but F32 [4] needs 16 bytes"});
}

TEST_F(SafetensorsTest, RejectsSizeMismatchForHalfPrecision) {
  SafetensorsBuilder builder;
  builder.add("h", "BF16", {2, 3}, std::string(6, '\0'));
  expect_rejected(builder, {"tensor 'h'", "BF16 [2, 3] needs 12 bytes"});
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  SafetensorsBuilder builder;
  builder.add_values<float>("a", "F32", {4}, {1, 2, 3, 4});
  builder.add_tensor({.name = "b",
                      .dtype = "F32",
                      .shape = {2},
                      .bytes = std::string(8, '\0'),
                      .data_offsets = {{8, 16}},
                      .raw_entry = {}});
  expect_rejected(builder, {"tensor 'b': data_offsets [8, 16] overlap tensor 'a' at [0, 16]"});
}

TEST_F(SafetensorsTest, RejectsDuplicateTensorNames) {
  SafetensorsBuilder builder;
  builder.add_values<float>("a", "F32", {1}, {1});
  builder.corrupt().extra_header_entries = R"(,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  expect_rejected(builder, {"tensor 'a' appears more than once"});
}

TEST_F(SafetensorsTest, RejectsDuplicateKeyInsideEntry) {
  expect_rejected(with_raw_entry(R"({"dtype": "F32", "dtype": "I32", "shape": [0], "data_offsets": [16, 16]})"),
                  {"key 'dtype' appears more than once in 'b'"});
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotAnObject) {
  SafetensorsBuilder builder;
  builder.corrupt().header = R"({"__metadata__": ["format", "pt"]})";
  expect_rejected(builder, {"'__metadata__' must be an object of strings"});
}

TEST_F(SafetensorsTest, RejectsNonStringMetadataValue) {
  SafetensorsBuilder builder;
  builder.corrupt().header = R"({"__metadata__": {"format": "pt", "total": 12}})";
  expect_rejected(builder, {"'__metadata__' entry 'total' must be a string"});
}

TEST_F(SafetensorsTest, RejectsMissingFile) {
  expect_error([&] { SafetensorsFile file(dir_.file("absent.safetensors")); }, {"absent.safetensors", "cannot open"});
}

}  // namespace
}  // namespace kestrel
