/*
 * cache.pml: the prefix cache's shared pages in a prefill worker's pool, for
 * SPIN. A second model beside handoff.pml: the handoff to decode is that
 * model's; here a source page's tenancy ends in decode's ack, which may
 * publish it as a cached page, and what matters is what follows: shared
 * leases, reads through them, eviction, reclaim, and the index.
 *
 * What is proved (exhaustively, within the bounds below):
 *   C0  a tag names one tenancy: the pool never hands out (reserve, publish)
 *       a tag of a page it handed out before, which is what makes a stale
 *       tag a refused one;
 *   C1  a read through a lease is never of a page whose tenancy (the one the
 *       lease was granted under) has ended: a read after a free, or after
 *       the page was reused, presents a stale tag and is refused;
 *   C2  no shared lease or read under another scope succeeds: what a reader
 *       is granted and reads was written by a writer of its scope;
 *   C3  a page with an outstanding shared lease is freed only by a reclaim
 *       after its eviction (at the deadline), never by eviction at once or
 *       by another reader's unlease;
 *   C4  the lease count never goes below zero;
 *   C5  at quiescence (every writer and reader done) every page is free, or
 *       cached with no lease.
 *
 * Payload is abstract: (scope, writer) says whose prefill wrote the bytes.
 * A page keeps its bytes when freed: a read that got through after a free
 * would see them, or a later writer's.
 *
 * Planted bugs, each built from this same file with spin -D<name>:
 *   MUTANT_NO_SCOPE_CHECK       LeaseShared does not compare the reader's
 *                               scope with the page's;
 *   MUTANT_EVICT_NO_GEN_BUMP    freeing an evicted cached page (at once, at
 *                               the last unlease, or by reclaim) keeps the
 *                               generation;
 *   MUTANT_UNLEASE_NO_COUNT     Unlease does not refuse when no lease is
 *                               outstanding;
 *   MUTANT_PUBLISH_NO_GEN_BUMP  publishing keeps the writer's generation, so
 *                               the cached tenancy has the writer's tag.
 * Each must end in an assertion violation; the model without them must not.
 *
 * See MAPPING.md for the Go code each part stands for and what is left out.
 */

/* ---------------------------------------------------------------- bounds */

#define NPAGES   2   /* pages of the prefill worker's pool                 */
#define NWRITERS 2   /* prefills whose pages may be published: one a scope */
#ifndef NREADERS_A
#define NREADERS_A 2 /* readers of scope A (shared leases, counted)        */
#endif
#ifndef DUP_MAX
#define DUP_MAX  0   /* unleases delivered twice, in total                 */
#endif
/* check.sh's "share" configuration is the defaults: two readers of scope A
   and one of scope B race the same pages; its "dup" configuration is
   -DNREADERS_A=1 -DDUP_MAX=1: one reader a scope, and one unlease given
   twice (see MAPPING.md for why not both at once). */
#define NREADERS (NREADERS_A + 1)

/* ---------------------------------------------------------------- values */

#define NOBODY   7
#define NOTAG    255
#define SCOPE_A  0
#define SCOPE_B  1
#define NOSCOPE  2

/* Page states, as kv.State: OWNED covers a writer's Reserved, Filling,
   Sealed and Released-awaiting-ack (the send's own lease is given back
   before decode can ack); EVICTED is Released with a scope, waiting for its
   last unlease or its reclaim deadline. */
#define FREE     0
#define OWNED    1
#define CACHED   2
#define EVICTED  3

#define TAG(i,g) ((i)*16 + (g))
#define TIDX(t)  ((t)/16)
#define TGEN(t)  ((t)%16)
#define GEN_MAX  15

/* Payload: the scope and the writer whose prefill wrote the bytes. BOOT is
   what a page holds before first use (no scope). */
#define CONT(s,w)  ((s)*8 + (w))
#define CSCOPE(x)  ((x)/8)
#define BOOT       CONT(3,0)

/* The scope guard of kv.Page.sharedAccess on LeaseShared. */
#ifdef MUTANT_NO_SCOPE_CHECK
#define LEASE_SCOPE_OK(i,s) true
#else
#define LEASE_SCOPE_OK(i,s) (psc[i] == (s))
#endif

/* The count guard of kv.Page.Unlease ("unlease without lease"). */
#ifdef MUTANT_UNLEASE_NO_COUNT
#define COUNT_OK(i) true
#else
#define COUNT_OK(i) (readers[i] > 0)
#endif

/* ---------------------------------------------------------------- state */

/* The pool (kv.Page fields). */
byte  st[NPAGES];
byte  gen[NPAGES];
byte  own[NPAGES]  = NOBODY;
byte  psc[NPAGES]  = NOSCOPE;   /* a cached (or evicted) page's scope      */
short readers[NPAGES];          /* signed, so that C4 can see below zero   */
byte  cont[NPAGES] = BOOT;      /* free does not wipe: stale bytes stay    */

/* Ghosts: the code has no such fields. ten counts the tenancies of a page
   that have ended (at every free and every publish, in the mutants too);
   held counts the shared leases granted under the current tenancy and not
   given back; issued is the set of generations a tag was handed out for. */
byte  ten[NPAGES];
byte  held[NPAGES];
int   issued[NPAGES];

/* The prefix index (kv.PrefixIndex): one entry a page at most, the cached
   tenancy's tag and scope (the CachedPage handle), NOTAG when none. */
byte  ix[NPAGES]  = NOTAG;
byte  ixs[NPAGES] = NOSCOPE;

byte  dups  = DUP_MAX;
byte  wdone;                    /* writers over */
byte  rdone;                    /* readers over */

/* ------------------------------------------------------------ pool steps */

/* C0: a new tenancy's tag was never handed out before. */
inline issue(i) {
  assert((issued[i] & (1 << gen[i])) == 0);
  issued[i] = issued[i] | (1 << gen[i])
}

/* kv.Page.free: the tenancy ends, the generation moves on (every tag of the
   tenancy is stale from now on), the bytes stay. rec says it is a reclaim
   at a deadline, the only free allowed under an outstanding lease (C3). */
inline free_page(i, rec) {
  assert(held[i] == 0 || (rec && st[i] == EVICTED));
#ifdef MUTANT_EVICT_NO_GEN_BUMP
  if
  :: psc[i] != NOSCOPE -> skip
  :: else -> assert(gen[i] < GEN_MAX); gen[i]++
  fi;
#else
  assert(gen[i] < GEN_MAX); gen[i]++;
#endif
  st[i] = FREE; own[i] = NOBODY; psc[i] = NOSCOPE; readers[i] = 0;
  ten[i]++; held[i] = 0
}

/* kv.Page.AckPublish with the writer's tag, as ExecAckKeep calls it: a page
   released and awaiting the ack is published under the writer's scope (the
   generation moves on, the owner is gone, the scope is set) and indexed
   (PrefixIndex.Add). A stale tag (reclaimed at the deadline meanwhile) is
   refused. */
inline ack_publish(i, g, w, s) {
  if
  :: gen[i] == g && own[i] == w && st[i] == OWNED ->
       ten[i]++;
#ifndef MUTANT_PUBLISH_NO_GEN_BUMP
       assert(gen[i] < GEN_MAX); gen[i]++;
#endif
       issue(i);
       own[i] = NOBODY; psc[i] = s; st[i] = CACHED;
       assert(ix[i] == NOTAG);            /* PrefixIndex.Add panics otherwise */
       ix[i] = TAG(i, gen[i]); ixs[i] = s
  :: else -> skip                         /* StaleTagError, OwnerError */
  fi
}

/* kv.Page.Unlease of a shared lease (tag t, scope s): the tag must be the
   page's current one, the page cached or evicted, the scope the page's, and
   a lease outstanding; the last unlease of an evicted page frees it. */
inline unlease(i, t, s) {
  if
  :: gen[i] == TGEN(t) && (st[i] == CACHED || st[i] == EVICTED) && psc[i] == s && COUNT_OK(i) ->
       readers[i]--;
       assert(readers[i] >= 0);           /* C4 */
       if
       :: readers[i] == 0 && st[i] == EVICTED -> free_page(i, false)
       :: else -> skip
       fi
  :: else -> skip          /* StaleTagError (reclaimed), StateError (no lease) */
  fi
}

/* PrefixCache.room → PrefixIndex.Victims (out of the index) → kv.Page.Evict:
   free at once with no lease, else wait (EVICTED) for the last unlease or
   the reclaim deadline. Uses the caller's scratch t, s. */
inline evict(i) {
  t = ix[i]; s = ixs[i]; ix[i] = NOTAG; ixs[i] = NOSCOPE;
  if
  :: gen[i] == TGEN(t) && st[i] == CACHED && psc[i] == s ->
       if
       :: readers[i] == 0 -> free_page(i, false)
       :: else -> st[i] = EVICTED
       fi
  :: else -> skip                         /* gone already */
  fi;
  t = 0; s = 0
}

/* PrefixIndex.Remove(tag): forget the entry if it is still there. */
inline index_remove(t) {
  if
  :: ix[TIDX(t)] == t -> ix[TIDX(t)] = NOTAG; ixs[TIDX(t)] = NOSCOPE
  :: else -> skip
  fi
}

/* -------------------------------------------------------------- writers */

/* One prefill of scope s: reserve a page (any free one), write and seal
   it, send it, release it awaiting decode's ack. Then decode acks (the page
   is published and indexed) or the reclaim deadline comes first (the page
   is freed); a late ack may still come, and must be refused. */
proctype Writer(byte w; byte s) {
  byte i, g;

  atomic {
    if
    :: st[0] == FREE -> i = 0
    :: st[1] == FREE -> i = 1
    fi;
    assert(own[i] == NOBODY && readers[i] == 0 && held[i] == 0);
    issue(i);
    st[i] = OWNED; own[i] = w; cont[i] = CONT(s, w); g = gen[i]
  };
  if
  :: atomic { ack_publish(i, g, w, s) }                    /* decode's ack */
  :: atomic {                                              /* Pool.Tick    */
       gen[i] == g && own[i] == w && st[i] == OWNED -> free_page(i, true) }
  fi;
  if
  :: atomic { ack_publish(i, g, w, s) }                    /* late ack     */
  :: skip
  fi;
  atomic { i = 0; g = 0; wdone++ }
}

/* -------------------------------------------------------------- readers */

/* One later prefill of scope s looking the cache up: PrefixIndex.Match
   finds an entry (any entry: a key collision or an index bug is the worst
   case, so a reader of the other scope probes every page), then asks the
   page for a shared lease, a separate step, so evictions, reclaims and
   reuse may come between. A refused lease forgets the entry (a miss). A
   granted one is read through (pageClient.Read: the generation alone is
   checked) at any moment until it is given back. */
proctype Reader(byte r; byte s) {
  byte e, i, lten;

  if
  :: atomic { ix[0] != NOTAG -> e = ix[0] }
  :: atomic { ix[1] != NOTAG -> e = ix[1] }
  :: atomic { goto done }                                  /* miss */
  fi;

  atomic {                                                 /* LeaseShared */
    i = TIDX(e);
    if
    :: gen[i] == TGEN(e) && st[i] == CACHED && LEASE_SCOPE_OK(i, s) ->
         assert(CSCOPE(cont[i]) == s);                     /* C2 */
         readers[i]++; held[i]++; lten = ten[i]
    :: else -> index_remove(e); goto done                  /* stale: a miss */
    fi
  };

  atomic {                                                 /* Read */
    if
    :: gen[i] == TGEN(e) ->
         assert(ten[i] == lten && (st[i] == CACHED || st[i] == EVICTED)); /* C1 */
         assert(CSCOPE(cont[i]) == s)                      /* C2 */
    :: else -> skip                                        /* StaleTagError */
    fi
  };

  atomic {                                                 /* Unlease */
    if
    :: ten[i] == lten -> held[i]--
    :: else -> skip                   /* reclaimed under the lease already */
    fi;
    unlease(i, e, s)
  };
  if
  :: atomic { dups > 0 -> dups--; unlease(i, e, s) }      /* given twice */
  :: skip
  fi;

done:
  atomic { e = 0; i = 0; lten = 0; rdone++ }
}

/* ------------------------------------------------- eviction and reclaim */

/* Eviction of any indexed page at any time (PrefixCache.room, from
   ExecAckKeep and reserveEvicting), and the reclaim deadline of an evicted
   page (Pool.Tick) at any time after its eviction. */
active proctype Evictor() {
  byte t, s;
end_evict:
  do
  :: atomic { ix[0] != NOTAG -> evict(0) }
  :: atomic { ix[1] != NOTAG -> evict(1) }
  :: atomic { st[0] == EVICTED -> free_page(0, true) }
  :: atomic { st[1] == EVICTED -> free_page(1, true) }
  od
}

/* ----------------------------------------------------------- quiescence */

/* C5: once every writer and reader is done, every page is free, or cached
   with no lease (and no lease is held by anyone). */
active proctype Quiescence() {
  byte i;
  (wdone == NWRITERS && rdone == NREADERS);
  atomic {
    i = 0;
    do
    :: i < NPAGES ->
         assert(st[i] == FREE || (st[i] == CACHED && readers[i] == 0));
         assert(held[i] == 0);
         i++
    :: else -> break
    od
  }
}

init {
  atomic {
    run Writer(0, SCOPE_A); run Writer(1, SCOPE_B);
    run Reader(0, SCOPE_A);
#if NREADERS_A > 1
    run Reader(1, SCOPE_A);
#endif
    run Reader(2, SCOPE_B)
  }
}
