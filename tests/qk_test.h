/* tests/qk_test.h — the one CHECK of the test programs (C and C++).

   CHECK(cond) or CHECK(cond, fmt, ...) counts a check (qk_test_checks); where cond is false it
   prints "FAIL file:line: cond" and, when given, ": " and the formatted detail, on stdout, and
   counts a failure (qk_test_fails). Define QK_TEST_DETAIL(), an expression giving a string,
   before the include to append it to every failure (test_tune_cache: qk_last_error()). */
#ifndef QK_TEST_H
#define QK_TEST_H
#include <stdarg.h>
#include <stdio.h>

static int qk_test_checks, qk_test_fails;

static void qk_test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    ++qk_test_fails;
    printf("FAIL %s:%d: %s", file, line, cond);
    if (fmt) {
        printf(": ");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
    }
#ifdef QK_TEST_DETAIL
    printf(" (%s)", QK_TEST_DETAIL());
#endif
    printf("\n");
    fflush(stdout);
}

#define QK_TEST_CHECK_(c, ...)                                       \
    do {                                                             \
        ++qk_test_checks;                                            \
        if (!(c)) qk_test_fail(__FILE__, __LINE__, #c, __VA_ARGS__); \
    } while (0)
#define CHECK(...) QK_TEST_CHECK_(__VA_ARGS__, (const char *)0)

#endif /* QK_TEST_H */
