// The job secret in a private file whose path (never the secret) is handed
// to the workers as KOLO_SECRET_FILE.
#ifndef KOLO_TOOLS_KOLORUN_SECRET_FILE_H_
#define KOLO_TOOLS_KOLORUN_SECRET_FILE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kolo {
namespace kolorun {

class SecretFile {
 public:
  // Writes `secret` to a new file (mkstemp: mode 0600, unique name) in
  // $TMPDIR, or /tmp when TMPDIR is unset or empty.
  static absl::StatusOr<std::unique_ptr<SecretFile>> Create(
      const std::string& secret);
  // Removes the file.
  ~SecretFile();
  SecretFile(const SecretFile&) = delete;
  SecretFile& operator=(const SecretFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  explicit SecretFile(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_SECRET_FILE_H_
