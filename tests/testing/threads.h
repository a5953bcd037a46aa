// Threads of this process as the kernel counts them, for tests that check
// that something costs no thread.
#ifndef KOLO_TESTS_TESTING_THREADS_H_
#define KOLO_TESTS_TESTING_THREADS_H_

#include <dirent.h>

namespace kolo {
namespace testing {

// Entries of /proc/self/task; -1 if it cannot be read.
inline int ThreadCount() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (struct dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_THREADS_H_
