// Stops the threads of every Runtime still alive when the process exits.
//
// Note [Runtimes at exit]
// A program may leave main (or call exit()) with a Runtime it never shut
// down: after a kolo error, typically, or with the frontends' default
// instance, which lives until the process ends. exit() then destroys
// objects of static lifetime (the C++ library's, OpenSSL's, the program's)
// while kolo's threads (the background loop, the control plane's readers
// and heartbeats) still run, and a thread touching one of them crashes the
// process at exit instead of letting it end with its own exit code. So the
// first Runtime registers a handler with std::atexit, which runs before the
// static objects constructed earlier are destroyed (handlers and static
// destructors run in reverse order of registration); the handler stops every
// live runtime as Abort() does, quietly: pending work fails, the control
// plane's threads are joined, the background thread gets a short while to
// end (it is left alone if it is stuck in a backend, which Abort() has
// closed). A runtime destroyed normally leaves the registry first.
//
// Thread safety: every function may be called from any thread.
#ifndef KOLO_RUNTIME_API_EXIT_GUARD_H_
#define KOLO_RUNTIME_API_EXIT_GUARD_H_

#include <functional>
#include <memory>

namespace kolo {

class RuntimeImpl;

// Adds `runtime` to the runtimes stopped at exit (installing the handler
// the first time).
void StopAtExit(const std::shared_ptr<RuntimeImpl>& runtime);
// Removes it (the runtime is being destroyed or was stopped).
void ForgetAtExit(const RuntimeImpl* runtime);

}  // namespace kolo

#endif  // KOLO_RUNTIME_API_EXIT_GUARD_H_
