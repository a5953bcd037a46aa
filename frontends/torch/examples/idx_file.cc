#include "frontends/torch/examples/idx_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kolo {
namespace examples {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// gzread reads at most UINT_MAX bytes per call.
bool ReadFully(gzFile f, void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const unsigned chunk =
        n > (1u << 30) ? (1u << 30) : static_cast<unsigned>(n);
    const int got = gzread(f, p, chunk);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t BigEndian32(const uint8_t* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

}  // namespace

absl::StatusOr<IdxFile> ReadIdx(const std::string& path, int64_t limit) {
  // gzopen also reads files that are not compressed, as they are.
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    std::string why = err ? std::strerror(err) : "cannot open";
    return err == ENOENT
               ? absl::NotFoundError(absl::StrCat(path, ": ", why))
               : absl::UnavailableError(absl::StrCat(path, ": ", why));
  }
  uint8_t magic[4];
  if (!ReadFully(f.get(), magic, 4) || magic[0] != 0 || magic[1] != 0 ||
      magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": not an IDX file of unsigned bytes"));
  }
  IdxFile idx;
  int64_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t b[4];
    if (!ReadFully(f.get(), b, 4)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated header"));
    }
    idx.dims.push_back(BigEndian32(b));
  }
  if (limit > 0 && idx.dims[0] > limit) idx.dims[0] = limit;
  for (int64_t d : idx.dims) total *= d;
  idx.data.resize(static_cast<size_t>(total));
  if (total > 0 && !ReadFully(f.get(), idx.data.data(), idx.data.size())) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: expected [",
                                            absl::StrJoin(idx.dims, ","),
                                            "] bytes of data"));
  }
  return idx;
}

}  // namespace examples
}  // namespace kolo
