// SafetensorsWriter: what it writes is read back by our own reader and Checkpoint (single file and shards + index),
// shards respect the size limit, and misuse is an Error that leaves no half-written files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "formats/checkpoint.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "safetensors_builder.h"

namespace kestrel {
namespace {

using testing::expect_error;
using testing::ScratchDir;

std::vector<std::byte> pattern(size_t size, int seed) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i * 31 + static_cast<size_t>(seed)) & 0xff);
  return bytes;
}

std::vector<std::byte> contents(const TensorView& view) { return {view.data, view.data + view.nbytes}; }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(SafetensorsWriter, SingleFileRoundTrips) {
  const ScratchDir dir;
  SafetensorsWriter writer(dir.path(), 1 << 20);
  const auto a = pattern(4 * 6, 1), b = pattern(2 * 8, 2);
  writer.add("a.weight", DType::f32, {2, 3}, a);
  writer.add_borrowed("b.trellis", DType::i16, {2, 1, 4}, b);
  writer.add("b.mcg", DType::i32, {}, pattern(4, 3));
  EXPECT_EQ(writer.finish(), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"model.safetensors"}));

  const SafetensorsFile file(dir.file("model.safetensors"));
  ASSERT_EQ(file.tensors().size(), 3u);
  const TensorView* view = file.find("a.weight");
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->dtype, DType::f32);
  EXPECT_EQ(view->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(contents(*view), a);
  EXPECT_EQ(contents(*file.find("b.trellis")), b);
  EXPECT_TRUE(file.find("b.mcg")->shape.empty());
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST(SafetensorsWriter, ShardsStayUnderTheLimitAndTheIndexListsEveryTensor) {
  const ScratchDir dir;
  testing::write_file(dir.file("config.json"), "{}");
  SafetensorsWriter writer(dir.path(), 100);
  writer.add("t1", DType::u8, {60}, pattern(60, 1));
  writer.add("t2", DType::u8, {60}, pattern(60, 2));    // 120 > 100: a new shard
  writer.add("t3", DType::u8, {30}, pattern(30, 3));    // 90: same shard
  writer.add("t4", DType::u8, {200}, pattern(200, 4));  // larger than the limit: a shard of its own
  const std::vector<std::string> expected = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(writer.finish(), expected);
  EXPECT_EQ(writer.total_bytes(), 350u);

  std::ifstream index_stream(dir.file("model.safetensors.index.json"));
  const nlohmann::json index = nlohmann::json::parse(index_stream);
  EXPECT_EQ(index["metadata"]["total_size"], 350);
  EXPECT_EQ(index["weight_map"]["t1"], expected[0]);
  EXPECT_EQ(index["weight_map"]["t2"], expected[1]);
  EXPECT_EQ(index["weight_map"]["t3"], expected[1]);
  EXPECT_EQ(index["weight_map"]["t4"], expected[2]);

  // Our checkpoint reader cross-checks the index against the shards.
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint.num_shards(), 3u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"t1", "t2", "t3", "t4"}));
  EXPECT_EQ(contents(checkpoint.get("t3")), pattern(30, 3));
  EXPECT_EQ(contents(checkpoint.get("t4")), pattern(200, 4));
}

TEST(SafetensorsWriter, MisuseIsAnErrorAndAnAbandonedWriterLeavesNoFiles) {
  const ScratchDir dir;
  {
    SafetensorsWriter writer(dir.path(), 10);
    writer.add("x", DType::u8, {8}, pattern(8, 0));
    writer.add("y", DType::u8, {8}, pattern(8, 0));  // flushes x's shard
    expect_error([&] { writer.add("x", DType::u8, {8}, pattern(8, 0)); }, {"x", "added twice"});
    expect_error([&] { writer.add("z", DType::f32, {3}, pattern(8, 0)); }, {"z", "8 bytes", "12"});
    expect_error([&] { writer.add("__metadata__", DType::u8, {1}, pattern(1, 0)); }, {"bad tensor name"});
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
  expect_error([&] { SafetensorsWriter(dir.file("missing"), 10); }, {"missing", "not a directory"});
  SafetensorsWriter empty(dir.path(), 10);
  expect_error([&] { empty.finish(); }, {"no tensors"});
}

}  // namespace
}  // namespace kestrel
