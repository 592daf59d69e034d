/* An asynchronous O_DIRECT write (raw io_submit, no libaio needed), then a buffered read of
 * the range, cycled while another thread keeps reading the file buffered (as xfstests
 * generic/451 does): prints how many buffered reads after a completed write returned stale
 * data. Used by tests/posix.rs. Usage: aio_dio_then_buffered_read FILE CYCLES */
#define _GNU_SOURCE
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static const char *path;
static volatile int stop;
static void *reader(void *a) {
    int fd = open(path, O_RDONLY);
    static char buf[65536];
    while (!stop) pread(fd, buf, sizeof buf, 0);
    close(fd);
    return a;
}
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    path = argv[1];
    int cycles = atoi(argv[2]);
    size_t sz = 65536;
    int dfd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (dfd < 0) { perror("open O_DIRECT"); return 2; }
    void *wbuf;
    if (posix_memalign(&wbuf, 4096, sz)) return 2;
    char *rbuf = malloc(sz);
    memset(wbuf, 0, sz);
    if (pwrite(dfd, wbuf, sz, 0) != (ssize_t)sz) { perror("pwrite"); return 2; }
    int bfd = open(path, O_RDONLY);
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, 1, &ctx)) { perror("io_setup"); return 2; }
    pthread_t t;
    pthread_create(&t, 0, reader, 0);
    int bad = 0;
    for (int i = 1; i <= cycles; i++) {
        memset(wbuf, i % 255 + 1, sz);
        struct iocb cb;
        memset(&cb, 0, sizeof cb);
        cb.aio_fildes = dfd;
        cb.aio_lio_opcode = IOCB_CMD_PWRITE;
        cb.aio_buf = (unsigned long)wbuf;
        cb.aio_nbytes = sz;
        cb.aio_offset = 0;
        struct iocb *cbs[1] = {&cb};
        if (syscall(SYS_io_submit, ctx, 1, cbs) != 1) { perror("io_submit"); return 2; }
        struct io_event ev;
        if (syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL) != 1) { perror("io_getevents"); return 2; }
        if (ev.res != (long long)sz) { fprintf(stderr, "aio write: %lld\n", (long long)ev.res); return 2; }
        if (pread(bfd, rbuf, sz, 0) != (ssize_t)sz || memcmp(rbuf, wbuf, sz)) bad++;
    }
    stop = 1;
    pthread_join(t, 0);
    printf("%d\n", bad);
    return 0;
}
