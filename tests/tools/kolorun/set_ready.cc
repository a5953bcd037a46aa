// Test worker helper: joins the rendezvous of the job kolorun started (from
// KOLO_RENDEZVOUS_ADDR/PORT, KOLO_SECRET_FILE, KOLO_RANK) and sets
// kolo/ready/<rank>, as the runtime does at the end of its initialisation.
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
  std::ifstream file(Env("KOLO_SECRET_FILE"));
  std::stringstream secret;
  secret << file.rdbuf();
  auto store = kolo::rendezvous::ConnectTcpStore(
      Env("KOLO_RENDEZVOUS_ADDR"),
      std::atoi(Env("KOLO_RENDEZVOUS_PORT").c_str()), secret.str(),
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
