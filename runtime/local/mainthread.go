package local

import goruntime "runtime"

// Every container start runs a goroutine of libcontainer's
// (goCreateMountSources) that joins the container's mount namespace on a
// locked thread and returns without unlocking it, so that the Go runtime
// ends the thread. The runtime never ends the process's main thread: when
// that goroutine happens to run there, the thread is parked for good
// instead, still in the container's mount namespace, which then outlives
// the container with every mount in it (its root overlay, and so the
// sandbox's writable layer, its disk and loop device) until the process
// exits. Locking the main goroutine to the main thread from the start keeps
// every other goroutine off it.
func init() { goruntime.LockOSThread() }
