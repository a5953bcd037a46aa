// Reads IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or
// not. No LibTorch here: this compiles in a second.
#ifndef KOLO_FRONTENDS_TORCH_EXAMPLES_IDX_FILE_H_
#define KOLO_FRONTENDS_TORCH_EXAMPLES_IDX_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kolo {
namespace examples {

struct IdxFile {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} or {60000}
  std::vector<uint8_t> data;  // row-major, prod(dims) bytes
};

// Reads an IDX file of unsigned bytes (type 0x08), at most `limit` items
// along the first dimension (0 = all). NotFound naming the path when the
// file does not exist; DataLoss for a truncated or malformed file.
absl::StatusOr<IdxFile> ReadIdx(const std::string& path, int64_t limit = 0);

}  // namespace examples
}  // namespace kolo

#endif  // KOLO_FRONTENDS_TORCH_EXAMPLES_IDX_FILE_H_
