// cpu::Copy and its vector loops: every byte lands where memcpy would put
// it, for every size around the thresholds and every alignment of both ends,
// and nothing outside the destination changes.
#include "ops/cpu/copy.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace kolo {
namespace cpu {
namespace {

void ExpectCopies(int width) {
  const std::vector<size_t> sizes = {0,    1,    63,   64,    65,    255,
                                     256,  257,  2047, 2048,  2049,  4095,
                                     4096, 4097, 9000, 65536, 262147};
  std::vector<uint8_t> from(262147 + 128), to(262147 + 256);
  for (size_t i = 0; i < from.size(); ++i)
    from[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t bytes : sizes) {
    for (size_t from_offset : {0, 1, 16, 63}) {
      for (size_t to_offset : {0, 1, 16, 33, 64}) {
        std::fill(to.begin(), to.end(), 0xee);
        uint8_t* out = to.data() + 64 + to_offset;
        const uint8_t* in = from.data() + from_offset;
        if (width == 0) {
          Copy(out, in, bytes);
        } else {
          CopyWithVectors(out, in, bytes, width);
        }
        ASSERT_EQ(std::memcmp(out, in, bytes), 0)
            << "width " << width << " bytes " << bytes << " offsets "
            << from_offset << "/" << to_offset;
        for (uint8_t* p = to.data(); p < out; ++p) ASSERT_EQ(*p, 0xee);
        for (uint8_t* p = out + bytes; p < to.data() + to.size(); ++p) {
          ASSERT_EQ(*p, 0xee)
              << "wrote past the end: width " << width << " bytes " << bytes;
        }
      }
    }
  }
}

TEST(Copy, SameBytesAsMemcpy) { ExpectCopies(0); }

TEST(Copy, EveryVectorWidthOfThisCpu) {
  const std::vector<int> widths = VectorCopyWidths();
  for (int width : widths) ExpectCopies(width);
#if defined(__x86_64__)
  EXPECT_FALSE(widths.empty()) << "SSE2 is part of x86-64";
#endif
}

}  // namespace
}  // namespace cpu
}  // namespace kolo
