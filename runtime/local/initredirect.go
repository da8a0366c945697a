package local

/*
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// The memfd that sealInit fills with orchard-init, as readlink shows it.
static const char orchard_init_memfd[] = "/memfd:runc_cloned:orchard-init";

// orchard_init_redirect makes a container's init run as orchard-init.
//
// libcontainer starts every container's init by re-executing this binary
// ("<exe> init"), whose Go runtime then initialises every package linked
// in: ≈4 ms of CPU per create for the server. When the runtime hands the
// init a sealed orchard-init (Config.InitPath), this constructor, which
// runs before the Go runtime and before libcontainer's own constructor
// (nsenter's has no priority, so runs after this one), re-executes the
// process as orchard-init with the same arguments, environment and other
// descriptors; libcontainer's start-up then goes on there. The descriptor
// is close-on-exec first: orchard-init runs from it without holding it, so
// the sandbox never sees it. On any failure the process goes on as this
// binary, the init it would have been without the redirect.
__attribute__((constructor(101))) static void orchard_init_redirect(int argc, char **argv, char **envp) {
	if (argc < 2 || strcmp(argv[1], "init") != 0 || getenv("_LIBCONTAINER_INITPIPE") == NULL)
		return;
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return;
	int fd = -1;
	struct dirent *e;
	while (fd < 0 && (e = readdir(d)) != NULL) {
		char path[64], link[sizeof orchard_init_memfd];
		int n = atoi(e->d_name);
		if (n < 3 || n == dirfd(d))
			continue;
		snprintf(path, sizeof path, "/proc/self/fd/%d", n);
		ssize_t len = readlink(path, link, sizeof link);
		if (len == (ssize_t)(sizeof link) && memcmp(link, orchard_init_memfd, sizeof link - 1) == 0)
			fd = n;
	}
	closedir(d);
	if (fd < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return;
	syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
	fcntl(fd, F_SETFD, 0);
}
*/
import "C"
