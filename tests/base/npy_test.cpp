// .npy files: writing float32 arrays and reading them back, plus reading int32 arrays and rejecting bad files.
#include "base/npy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace kestrel {
namespace {

class NpyTest : public ::testing::Test {
protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a version 1.0 .npy by hand: `header` is the dict text, padded here to a multiple of 64.
  void write_raw_npy(const std::string& file, std::string header, const std::string& data) const {
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header.push_back('\n');
    std::ofstream out(file, std::ios::binary);
    const auto length = static_cast<uint16_t>(header.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(length & 0xff));
    out.put(static_cast<char>(length >> 8));
    out << header << data;
  }

  std::filesystem::path dir_ = [] {
    const auto unique = std::filesystem::temp_directory_path() /
                        ("kestrel_npy_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(unique);
    return unique;
  }();
};

TEST_F(NpyTest, RoundTripsFloat32) {
  std::vector<float> values(2 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3.25f;
  values[5] = -0.0f;
  values[7] = 3.4e38f;
  write_npy_f32(path("a.npy"), {2, 3, 4}, values.data());
  const NpyArray array = read_npy(path("a.npy"));
  EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(array.data.size(), values.size());
  EXPECT_EQ(std::memcmp(array.data.data(), values.data(), values.size() * sizeof(float)), 0);
}

TEST_F(NpyTest, RoundTripsOneDimensionalAndEmpty) {
  const std::vector<float> values = {1, 2, 3};
  write_npy_f32(path("v.npy"), {3}, values.data());
  EXPECT_EQ(read_npy(path("v.npy")).shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(read_npy(path("v.npy")).data, values);

  write_npy_f32(path("e.npy"), {0, 5}, values.data());
  const NpyArray empty = read_npy(path("e.npy"));
  EXPECT_EQ(empty.shape, (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(empty.data.empty());
}

TEST_F(NpyTest, WrittenHeaderIsAlignedTo64Bytes) {
  const std::vector<float> values = {1, 2};
  write_npy_f32(path("h.npy"), {2}, values.data());
  EXPECT_EQ(std::filesystem::file_size(path("h.npy")) % 64, 8u);  // header multiple of 64, then 8 data bytes
}

TEST_F(NpyTest, ReadsInt32AsFloat) {
  const std::vector<int32_t> values = {-7, 0, 154820};
  std::string data(values.size() * 4, '\0');
  std::memcpy(data.data(), values.data(), data.size());
  write_raw_npy(path("i.npy"), "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", data);
  const NpyArray array = read_npy(path("i.npy"));
  EXPECT_EQ(array.data, (std::vector<float>{-7.0f, 0.0f, 154820.0f}));
}

TEST_F(NpyTest, RejectsUnsupportedDtype) {
  write_raw_npy(path("d.npy"), "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0'));
  EXPECT_THROW(read_npy(path("d.npy")), Error);
}

TEST_F(NpyTest, RejectsFortranOrder) {
  write_raw_npy(path("f.npy"), "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", std::string(4, '\0'));
  EXPECT_THROW(read_npy(path("f.npy")), Error);
}

TEST_F(NpyTest, RejectsSizeMismatch) {
  write_raw_npy(path("s.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(8, '\0'));
  EXPECT_THROW(read_npy(path("s.npy")), Error);
}

TEST_F(NpyTest, RejectsNonNpyFile) {
  std::ofstream(path("x.npy")) << "hello world";
  EXPECT_THROW(read_npy(path("x.npy")), Error);
}

}  // namespace
}  // namespace kestrel
