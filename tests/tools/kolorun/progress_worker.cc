// A C++ worker that prints progress as LibTorch's examples do: one line
// rewritten with '\r', no newline until the end. Between steps it waits for
// the test to open the fifo $SCRATCH/step<N>, so that the test can see each
// step on kolorun's output while the worker is still running.
//
//   progress_worker unbuffered|plain STEPS
//
// unbuffered: setvbuf(stdout, nullptr, _IONBF, 0) first, as docs/multihost.md
// ("Output") tells C and C++ programs to do; plain: stdio's own buffering (a
// pipe's is full buffering), e.g. for `stdbuf -o0 progress_worker plain N`.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: progress_worker unbuffered|plain STEPS\n");
    return 2;
  }
  if (std::strcmp(argv[1], "unbuffered") == 0) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
  }
  const int steps = std::atoi(argv[2]);
  const char* scratch = std::getenv("SCRATCH");
  for (int step = 1; step <= steps; ++step) {
    std::printf("\rTrain step %d/%d", step, steps);
    if (step == steps) break;
    // Blocks until the test opens the fifo for writing and closes it.
    const std::string fifo =
        std::string(scratch ? scratch : ".") + "/step" + std::to_string(step);
    const int fd = open(fifo.c_str(), O_RDONLY);
    if (fd < 0) {
      std::perror(fifo.c_str());
      return 1;
    }
    char byte;
    while (read(fd, &byte, 1) > 0) {
    }
    close(fd);
  }
  std::printf("\n");
  return 0;
}
