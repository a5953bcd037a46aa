// Test worker helper: joins the rendezvous of the job kolorun started (from
// KOLO_RENDEZVOUS_ADDR/PORT, KOLO_SECRET_FD, KOLO_RANK) and sets
// kolo/ready/<rank>, as the runtime does at the end of its initialisation.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/tcp_store.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

int main() {
  char buffer[256];
  const ssize_t n = pread(std::atoi(Env("KOLO_SECRET_FD").c_str()), buffer,
                          sizeof(buffer), 0);
  if (n <= 0) {
    std::fprintf(stderr, "set_ready: cannot read KOLO_SECRET_FD\n");
    return 1;
  }
  const std::string secret(buffer, static_cast<size_t>(n));
  auto store = kolo::rendezvous::ConnectTcpStore(
      Env("KOLO_RENDEZVOUS_ADDR"),
      std::atoi(Env("KOLO_RENDEZVOUS_PORT").c_str()), secret,
      absl::Seconds(30));
  if (!store.ok()) {
    std::fprintf(stderr, "set_ready: %s\n",
                 std::string(store.status().message()).c_str());
    return 1;
  }
  absl::Status status =
      (*store)->Set(absl::StrCat("kolo/ready/", Env("KOLO_RANK")), "1");
  if (!status.ok()) {
    std::fprintf(stderr, "set_ready: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
