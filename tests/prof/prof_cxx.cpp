// qk_prof from C++: the implementation compiles as C++, QK_PROF_SCOPE is an RAII guard (also on
// early return and exceptions), QK_PROF_FUNC names the zone after the function.
#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"
#include "qk_prof.h" // a second include: guarded

#include <cstring>
#include <stdexcept>

#include "../qk_test.h"

static uint64_t fake_now;
static uint64_t fake_clock(void *) { return fake_now; }

static int early(int x)
{
    QK_PROF_SCOPE("early");
    fake_now += 4;
    if (x > 0) return 1;
    fake_now += 100;
    return 0;
}

static void thrower()
{
    QK_PROF_SCOPE("thrower");
    fake_now += 9;
    throw std::runtime_error("x");
}

static void named_after_me()
{
    QK_PROF_FUNC();
    fake_now += 2;
}

int main()
{
    qk_prof_desc d;
    std::memset(&d, 0, sizeof d);
    d.clock = fake_clock;
    CHECK(qk_prof_init(&d) == 0);
    for (int i = 0; i < 3; i++) early(1);
    try { thrower(); } catch (const std::exception &) {}
    named_after_me();
    named_after_me();
    qk_prof_stats st;
    CHECK(qk_prof_zone_stats("early", 0, &st) == 0 && st.calls == 3 && st.total_ns == 12);
    CHECK(qk_prof_zone_stats("thrower", 0, &st) == 0 && st.calls == 1 && st.total_ns == 9);
    CHECK(qk_prof_zone_stats("named_after_me", 0, &st) == 0 && st.calls == 2 && st.total_ns == 4);
    qk_prof_summary s;
    qk_prof_get_summary(&s);
    CHECK(s.unbalanced == 0 && s.mismatched == 0);
    qk_prof_shutdown();
    if (qk_test_fails) return 1;
    std::fprintf(stderr, "prof_cxx: ok\n");
    return 0;
}
