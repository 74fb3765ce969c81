/* qk_prof_write_file's temporary file is created exclusively (issue 27, item 1): symlinks planted
   at the predictable names (path.tmp<pid>, path.tmp<pid>.1, ...) pointing at a victim file, or at
   a file not yet there, are skipped, never written through; the report is written and is a
   regular file; when every name is taken the call fails cleanly; the file mode is fopen's (0666
   less the umask); a FIFO or a directory at the path is refused, not replaced. POSIX only. */
#define _POSIX_C_SOURCE 200809L
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../qk_test.h"

static char dir[256];

static void join(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static void tmp_name(char *out, size_t cap, const char *path, int k)
{
    if (k == 0) snprintf(out, cap, "%s.tmp%ld", path, (long)getpid());
    else snprintf(out, cap, "%s.tmp%ld.%d", path, (long)getpid(), k);
}

/* the whole content of path (at most cap - 1 bytes), or "" */
static const char *slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    buf[0] = 0;
    if (!f) return buf;
    n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int is_regular(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int main(void)
{
    char victim[512], report[512], ghost[512], t[600], buf[4096];
    struct stat st;
    FILE *f;
    int k;
    qk_prof_desc desc;

    snprintf(dir, sizeof dir, "%s/qk_prof_tmpXXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) { printf("mkdtemp failed\n"); return 1; }
    join(victim, sizeof victim, "victim.txt");
    join(ghost, sizeof ghost, "ghost.txt");
    f = fopen(victim, "w");
    CHECK(f != NULL);
    if (!f) return 1;
    fputs("DATA\n", f);
    fclose(f);

    memset(&desc, 0, sizeof desc);
    CHECK(qk_prof_init(&desc) == 0);
    QK_PROF_BEGIN("tmpfile zone");
    QK_PROF_END("tmpfile zone");

    /* 1. symlinks at the first names (to the victim, and a dangling one to a file not there) */
    {
        static const qk_prof_format fmts[4] = {QK_PROF_TEXT, QK_PROF_JSON, QK_PROF_TRACE, QK_PROF_HTML};
        static const char *names[4] = {"rep.txt", "rep.json", "trace.json", "rep.html"};
        int i;
        for (i = 0; i < 4; i++) {
            join(report, sizeof report, names[i]);
            for (k = 0; k < 4; k++) {
                tmp_name(t, sizeof t, report, k);
                CHECK(symlink(k == 3 ? ghost : victim, t) == 0, "%s", t);
            }
            CHECK(qk_prof_write_file(fmts[i], report) == 0, "%s: %s", names[i], qk_prof_last_error());
            CHECK(strcmp(slurp(victim, buf, sizeof buf), "DATA\n") == 0, "%s: the victim now holds %.60s", names[i], buf);
            CHECK(lstat(ghost, &st) != 0, "%s: the dangling link's target was created", names[i]);
            CHECK(is_regular(report), "%s: the report is not a regular file", names[i]);
            CHECK(strstr(slurp(report, buf, sizeof buf), "tmpfile zone") != NULL, "%s: the zone is missing", names[i]);
            for (k = 0; k < 4; k++) {   /* the planted links are left as they were */
                tmp_name(t, sizeof t, report, k);
                CHECK(lstat(t, &st) == 0 && S_ISLNK(st.st_mode), "%s", t);
                unlink(t);
            }
            tmp_name(t, sizeof t, report, 4);   /* the name used was renamed away */
            CHECK(lstat(t, &st) != 0, "%s left behind", t);
            unlink(report);
        }
    }

    /* 2. a report path that is itself a symlink is replaced (rename), its target untouched */
    join(report, sizeof report, "linked.txt");
    CHECK(symlink(victim, report) == 0);
    CHECK(QK_PROF_REPORT(report) == 0, "%s", qk_prof_last_error());
    CHECK(strcmp(slurp(victim, buf, sizeof buf), "DATA\n") == 0);
    CHECK(is_regular(report));
    unlink(report);

    /* 3. every name taken: a clean failure, the victim and the report path untouched */
    join(report, sizeof report, "full.txt");
    for (k = 0; k < 100; k++) {
        tmp_name(t, sizeof t, report, k);
        CHECK(symlink(victim, t) == 0, "%s", t);
    }
    CHECK(QK_PROF_REPORT(report) == -1);
    CHECK(strstr(qk_prof_last_error(), "full.txt") != NULL && strstr(qk_prof_last_error(), "taken") != NULL, "%s",
          qk_prof_last_error());
    CHECK(strcmp(slurp(victim, buf, sizeof buf), "DATA\n") == 0);
    CHECK(lstat(report, &st) != 0);
    for (k = 0; k < 100; k++) {
        tmp_name(t, sizeof t, report, k);
        unlink(t);
    }

    /* 4. the mode is fopen's: 0666 less the umask */
    {
        mode_t old = umask(027);
        join(report, sizeof report, "mode.txt");
        CHECK(QK_PROF_REPORT(report) == 0, "%s", qk_prof_last_error());
        CHECK(stat(report, &st) == 0 && (st.st_mode & 0777) == 0640, "mode %o", (unsigned)(st.st_mode & 0777));
        unlink(report);
        umask(old);
    }

    /* 5. a FIFO or a directory at the path: refused, left as it was (a rename would replace it) */
    join(report, sizeof report, "fifo");
    CHECK(mkfifo(report, 0600) == 0);
    CHECK(QK_PROF_REPORT(report) == -1);
    CHECK(strstr(qk_prof_last_error(), "not a regular file") != NULL, "%s", qk_prof_last_error());
    CHECK(lstat(report, &st) == 0 && S_ISFIFO(st.st_mode));
    unlink(report);
    join(report, sizeof report, "sub");
    CHECK(mkdir(report, 0700) == 0);
    CHECK(QK_PROF_WRITE_HTML(report) == -1);
    CHECK(strstr(qk_prof_last_error(), "not a regular file") != NULL, "%s", qk_prof_last_error());
    CHECK(rmdir(report) == 0, "%s not empty", report);

    /* 6. a missing directory: an error naming the path, nothing created */
    join(report, sizeof report, "no/such/dir/rep.txt");
    CHECK(QK_PROF_REPORT(report) == -1);
    CHECK(strstr(qk_prof_last_error(), "no/such/dir") != NULL, "%s", qk_prof_last_error());

    qk_prof_shutdown();
    unlink(victim);
    CHECK(rmdir(dir) == 0, "%s not empty", dir);
    printf("%d checks, %d failures\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
