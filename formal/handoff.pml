/*
 * handoff.pml: the KV page lifecycle and the prefill -> decode handoff, for SPIN.
 *
 * What is proved (exhaustively, within the bounds below):
 *   P1  decode reads a page only through the tag its manifest expects: the page
 *       is in the very tenancy the request reserved, owned by that request;
 *   P2  the bytes decode reads were written for that request, that page and
 *       that attempt (never another tenant's, never a stale attempt's);
 *   P3  once both requests are over, no page is held (no leak).
 *
 * Payload is abstract: a value (request, page, version) that says for whom the
 * bytes were written, so a read can check ownership of content. A checksum is
 * ideal (a corrupted frame never matches by chance): it is the exact packing of
 * the fields it covers.
 *
 * Planted bugs, each built from this same file with spin -D<name>:
 *   MUTANT_NO_TAG_CHECK      receiver writes a frame into the page by index,
 *                            without checking the destination tag or its owner;
 *   MUTANT_NO_GEN_BUMP       release does not move the generation, so a new
 *                            tenancy of a page gets the old tag back;
 *   MUTANT_EARLY_RELEASE     prefill releases its source page right after the
 *                            first transmission instead of after the ack;
 *   MUTANT_HEADER_UNCHECKED  the frame checksum covers the payload only, not the
 *                            header (request, destination and source tags).
 * Each must end in an assertion violation; the model without them must not.
 *
 * See MAPPING.md for the Go code each part stands for and what is left out.
 */

/* ---------------------------------------------------------------- bounds */

#define NREQ     2   /* requests r=0 (tenant A) and r=1 (tenant B)        */
#ifndef DPAGES
#define DPAGES   2   /* decode pool pages (1 to 3); each request needs 1   */
#endif
#ifndef PPAGES
#define PPAGES   1   /* prefill pool pages (1 to 3); 1 forces reuse        */
#endif
#define NSLOT    3   /* frames in flight on the data plane at once         */
#ifndef RETX_MAX
#define RETX_MAX 1   /* retransmissions per attempt                        */
#endif
#ifndef RETRY_MAX
#define RETRY_MAX 0  /* re-plans by request 0 after a failed attempt      */
#endif
#ifndef CANCEL_MAX
#define CANCEL_MAX 1 /* client cancellations, in total                     */
#endif
#ifndef FAULT_MAX
#define FAULT_MAX 2  /* network faults of any kind, in total               */
#endif
/* Each fault kind may happen at most once, and at most FAULT_MAX in all.
   The defaults are check.sh's "faults" configuration; its "retry"
   configuration is -DRETRY_MAX=1 -DFAULT_MAX=1 -DCANCEL_MAX=0 -DRETX_MAX=0. */

/* ---------------------------------------------------------------- values */

#define NOBODY   2   /* owner of a free page                                */
#define NOTAG    255

/* Page states, as kv.State: Reserved covers Reserved and Filling (one frame
   fills one page here); a sealed page that prefill keeps for the peer's ack
   is Sealed with awaiting set. */
#define FREE     0
#define RESERVED 1
#define SEALED   2

/* A tag is (page index, generation); the node incarnation is one constant per
   pool and is left out. */
#define TAG(i,g) ((i)*16 + (g))
#define TIDX(t)  ((t)/16)
#define TGEN(t)  ((t)%16)
#define GEN_MAX  15

/* Payload (request, page within the request, version=attempt). Request 3 is
   nobody: BOOT is what a page holds before first use, GARBAGE what the
   network leaves after corrupting a payload. */
#define PAY(r,p,v) ((r)*64 + (p)*8 + (v))
#define PREQ(x)    ((x)/64)
#define PPAGE(x)   (((x)/8)%8)
#define PVER(x)    ((x)%8)
#define BOOT       PAY(3,0,0)
#define GARBAGE    PAY(3,7,7)

/* kv.AppendFrame's checksum: over the header {request (and so tenant),
   destination tag, source tag} and the payload. */
#ifdef MUTANT_HEADER_UNCHECKED
#define CSUM(rq,dt,st,p) (p)
#else
#define CSUM(rq,dt,st,p) ((rq)*16777216 + (dt)*65536 + (st)*256 + (p))
#endif

mtype = { PLAN, ABORT };

/* ---------------------------------------------------------------- state */

/* Decode pool (kv.Pool on the decode node). */
byte dstate[DPAGES];
byte dgen[DPAGES];
byte down[DPAGES] = NOBODY;
byte dcont[DPAGES] = BOOT;   /* release does not wipe: stale bytes stay      */
byte dstag[DPAGES];          /* source tag of the frame that sealed the page */
byte dlease[DPAGES];         /* open leases                                  */
bool drelease[DPAGES];       /* release asked while leased: deferred         */
byte dten[DPAGES];           /* ghost: tenancy count, moves on every reserve
                                even in the mutants; the code has no such
                                field, it is what the generation stands for */

/* Prefill pool (kv.Pool on the prefill node). */
byte pstate[PPAGES];
byte pgen[PPAGES];
byte pown[PPAGES] = NOBODY;
byte pcont[PPAGES] = BOOT;
bool pawait[PPAGES];         /* kept for the peer's acknowledgement           */

/* Data plane: an unordered bag of frames, so any frame may overtake any
   other (reordering). A frame header is {request, destination tag, source
   tag}; the tenant is a function of the request here. */
typedef Frame {
  bool used;
  byte rq;
  byte dt;
  byte st;
  byte pay;
  int  cs
};
Frame bag[NSLOT];
byte inflight;

/* Control plane, decode -> prefill, per request: plans and aborts, in order
   (one actor mailbox over one connection). Acks, prefill-bound, per request. */
chan ctl[NREQ] = [4] of { mtype, byte, byte };
chan ack[NREQ] = [2] of { byte };

/* The tag request r's manifest expects now (NOTAG between attempts): only the
   misdirection fault reads it, to aim a frame at a live page. */
byte want[NREQ] = NOTAG;

/* Budgets. */
byte faults    = FAULT_MAX;
byte f_loss    = 1;
byte f_dup     = 1;
byte f_corrupt = 1;
byte f_misdir  = 1;
byte retries   = RETRY_MAX;
byte cancels   = CANCEL_MAX;

bool dend[NREQ];             /* decode side of request r is over  */
bool pend[NREQ];             /* prefill side of request r is over */

/* ------------------------------------------------------------ pool steps */

/* Release: only the current tag and owner may release; while leased it is
   deferred, otherwise the page is free and the generation moves on, which
   turns every old tag (late frame, late ack, late read) into a refused one. */
inline free_decode(i) {
  dstate[i] = FREE; down[i] = NOBODY; drelease[i] = false;
#ifndef MUTANT_NO_GEN_BUMP
  assert(dgen[i] < GEN_MAX); dgen[i]++
#endif
}

inline release_decode(i, r, g) {
  if
  :: dgen[i] == g && down[i] == r && dstate[i] != FREE ->
       if
       :: dlease[i] > 0 -> drelease[i] = true
       :: else -> free_decode(i)
       fi
  :: else -> skip            /* stale release: refused (StaleTagError) */
  fi
}

inline release_prefill(t, r) {
  if
  :: pgen[TIDX(t)] == TGEN(t) && pown[TIDX(t)] == r && pstate[TIDX(t)] != FREE ->
       pstate[TIDX(t)] = FREE; pown[TIDX(t)] = NOBODY; pawait[TIDX(t)] = false;
#ifndef MUTANT_NO_GEN_BUMP
       assert(pgen[TIDX(t)] < GEN_MAX); pgen[TIDX(t)]++
#else
       skip
#endif
  :: else -> skip            /* stale tag or owner: refused */
  fi
}

/* Reserve(owner, 1): all-or-nothing, blocks while the pool is exhausted (the
   request waits in admission). The allocator may hand out any free page, which
   covers every free-list order. Must be the first statement of an atomic. */
inline reserve_decode(i, r) {
  if
  :: dstate[0] == FREE -> i = 0
#if DPAGES > 1
  :: dstate[1] == FREE -> i = 1
#endif
#if DPAGES > 2
  :: dstate[2] == FREE -> i = 2
#endif
  fi;
  assert(down[i] == NOBODY && dlease[i] == 0);
  dstate[i] = RESERVED; down[i] = r; dten[i]++
}

inline reserve_prefill(s, r) {
  if
  :: pstate[0] == FREE -> s = 0
#if PPAGES > 1
  :: pstate[1] == FREE -> s = 1
#endif
#if PPAGES > 2
  :: pstate[2] == FREE -> s = 2
#endif
  fi;
  assert(pown[s] == NOBODY);
  pstate[s] = RESERVED; pown[s] = r
}

/* The data plane reads the source bytes when it (re)transmits: f_pay is read
   at send time. The header and checksum are built as kv.AppendFrame does. The
   data plane is a bounded queue: a frame sent while NSLOT are in flight is
   dropped (a loss that needs no fault budget). Never blocks, so it can sit
   inside an atomic step. Uses the caller's scratch variable j. */
inline send_frame(f_rq, f_dt, f_st, f_pay) {
  if
  :: inflight < NSLOT ->
       j = 0;
       do
       :: bag[j].used -> j++
       :: else -> break
       od;
       bag[j].used = true; bag[j].rq = f_rq; bag[j].dt = f_dt; bag[j].st = f_st;
       bag[j].pay = f_pay; bag[j].cs = CSUM(f_rq, f_dt, f_st, f_pay);
       inflight++;
       j = 0
  :: else -> skip                              /* queue full: dropped */
  fi
}

/* Pick any frame in flight; the caller has checked inflight > 0. */
inline pick_frame(j) {
  if
  :: bag[0].used -> j = 0
  :: bag[1].used -> j = 1
  :: bag[2].used -> j = 2
  fi
}

inline drop_frame(j) {
  bag[j].used = false; bag[j].rq = 0; bag[j].dt = 0; bag[j].st = 0;
  bag[j].pay = 0; bag[j].cs = 0; inflight--
}

/* ---------------------------------------- data plane and decode receiver */

/* The decode node's data-plane receiver (kv.DecodeBatch checks the checksum,
   then requestActor.accept and Pool.Write check owner and tag; one frame fills
   the page, so Pool.Seal follows at once): a frame is written only if its checksum matches header and
   payload, and its destination tag is current, reserved and owned by the
   request the frame names. Anything else is dropped (and counted). */
inline receive(g_rq, g_dt, g_st, g_pay, g_cs) {
  di = TIDX(g_dt);
  if
  :: g_cs != CSUM(g_rq, g_dt, g_st, g_pay) -> skip              /* ChecksumError */
#ifdef MUTANT_NO_TAG_CHECK
  :: else ->
       if                                           /* by index alone */
       :: dstate[di] == RESERVED ->
            dcont[di] = g_pay; dstag[di] = g_st; dstate[di] = SEALED
       :: else -> skip
       fi
#else
  :: else ->
       if
       :: dstate[di] == RESERVED && dgen[di] == TGEN(g_dt) && down[di] == g_rq ->
            dcont[di] = g_pay; dstag[di] = g_st; dstate[di] = SEALED
       :: else -> skip                          /* StaleTagError, OwnerError */
       fi
#endif
  fi;
  di = 0
}

/* The network delivers any frame in flight at any time, so frames overtake
   each other (reordering) and may wait forever (loss, late arrival). A fault
   is applied at the moment of delivery, which loses no behaviour since a frame
   only matters when it arrives: each kind at most once, FAULT_MAX in all.
     loss         the frame is gone;
     duplication  it is delivered and a copy stays in flight;
     corruption   its payload arrives changed;
     misdirection its addressing header (request, so tenant, and destination
                  tag) arrives rewritten to name another live request's page:
                  the worst a misrouted or corrupted header can do.
   Acks and aborts are not lost explicitly: prefill may take its reclaim
   deadline before reading either, at any moment, which is what their loss
   would do; the unread message then arrives late and must be refused. */
active proctype DataPlane() {
  byte j, r, di;
end_net:
  do
  :: atomic {                                               /* delivery */
       inflight > 0 -> pick_frame(j);
       receive(bag[j].rq, bag[j].dt, bag[j].st, bag[j].pay, bag[j].cs);
       drop_frame(j); j = 0 }
  :: atomic {                                               /* loss */
       faults > 0 && f_loss > 0 && inflight > 0 -> pick_frame(j);
       drop_frame(j); f_loss--; faults--; j = 0 }
  :: atomic {                                               /* duplication */
       faults > 0 && f_dup > 0 && inflight > 0 -> pick_frame(j);
       receive(bag[j].rq, bag[j].dt, bag[j].st, bag[j].pay, bag[j].cs);
       f_dup--; faults--; j = 0 }
  :: atomic {                                               /* corruption */
       faults > 0 && f_corrupt > 0 && inflight > 0 -> pick_frame(j);
       receive(bag[j].rq, bag[j].dt, bag[j].st, GARBAGE, bag[j].cs);
       drop_frame(j); f_corrupt--; faults--; j = 0 }
  :: atomic {                                               /* misdirection */
       faults > 0 && f_misdir > 0 && inflight > 0 -> pick_frame(j);
       r = 1 - bag[j].rq;
       if
       :: want[r] != NOTAG ->
            receive(r, want[r], bag[j].st, bag[j].pay, bag[j].cs);
            drop_frame(j); f_misdir--; faults--
       :: else -> skip
       fi;
       j = 0; r = 0 }
  od
}

/* ------------------------------------------------------------ decode side */

/* One request on the decode node: reserve a destination page, send the plan,
   wait for the page to be sealed, verify the manifest, acknowledge, lease,
   read, release. A deadline or a client cancel may end an attempt at any
   moment; a failed (not cancelled) attempt is re-planned while the retry
   budget lasts: new reservation, new version.
   Each step is one atomic action, as one actor message is handled at a time;
   locals are zeroed when dead so that equal states compare equal. */

/* End the current attempt: release the page (generation moves on), tell
   prefill, and retry or stop. */
inline give_up() {
  release_decode(i, r, g); want[r] = NOTAG;
  ctl[r]!ABORT, a, 0;
  i = 0; g = 0; t = 0;
  if
  :: !cancelled && r == 0 && retries > 0 -> retries--; goto attempt
  :: else -> goto done
  fi
}

proctype Decode(byte r) {
  byte a = 0;     /* attempt: the plan's version                          */
  byte i;         /* reserved destination page                            */
  byte g;         /* its generation: the manifest expects tag TAG(i, g)   */
  byte t;         /* ghost: its tenancy number when reserved              */
  bool cancelled = false;
  bool released = false;

attempt:
  /* Pool.Reserve(owner, 1), record the manifest, send the plan. */
  atomic {
    reserve_decode(i, r);
    a++; g = dgen[i]; t = dten[i]; want[r] = TAG(i, g);
    ctl[r]!PLAN, a, TAG(i, g)
  };

  /* Wait for prefill's frame to seal the page, or give up. */
  if
  :: atomic {
       dstate[i] == SEALED ->
       /* Manifest.Verify: the expected tag is current, ours, and sealed. */
       if
       :: dgen[i] == g && down[i] == r -> skip
       :: else -> give_up()
       fi;
       /* Acknowledge the source tag: only now may prefill release its
          page. */
       ack[r]!dstag[i];
       dlease[i]++                      /* Pool.Lease: tag, owner, state */
     }
  :: atomic { dstate[i] != SEALED -> give_up() }       /* decode deadline */
  :: atomic { cancels > 0 -> cancels--; cancelled = true; give_up() }
  fi;

  do
  /* A cancel may race the read: the release is deferred while leased. */
  :: atomic {
       cancels > 0 && !released -> cancels--; cancelled = true;
       release_decode(i, r, g); released = true;
       assert(dstate[i] == SEALED && down[i] == r)
     }
  /* Pool.Read through the lease, then Pool.Unlease and Pool.Release. */
  :: atomic {
       /* P1: the page is the tenancy we reserved, under the expected tag. */
       assert(dten[i] == t && dgen[i] == g && down[i] == r && dstate[i] == SEALED);
       /* P2: the bytes were written for us, this page, this attempt. */
       assert(PREQ(dcont[i]) == r);
       assert(PPAGE(dcont[i]) == 0);
       assert(PVER(dcont[i]) == a);
       dlease[i]--;
       if
       :: dlease[i] == 0 && drelease[i] -> free_decode(i)
       :: else -> skip
       fi;
       if
       :: !released -> release_decode(i, r, g)
       :: else -> skip
       fi;
       want[r] = NOTAG;
       goto done
     }
  od;

done:
  atomic { a = 0; i = 0; g = 0; t = 0; cancelled = false; released = false;
           dend[r] = true }
}

/* ----------------------------------------------------------- prefill side */

/* One request on the prefill node: take a plan, reserve a source page,
   compute, seal and transmit it, then keep the page (AwaitAck) until an ack
   names its tag, a newer plan or an abort arrives, or the reclaim deadline
   passes. Only while the page is kept may it be retransmitted. */

/* Forget the attempt's locals. */
#define PF_CLEAR  s = 0; stg = 0; k = 0; x = 0; y = 0; m = 0

proctype Prefill(byte r) {
  mtype m;
  byte a, dt;     /* plan: version and destination tag                   */
  byte s;         /* source page                                          */
  byte stg;       /* its tag                                              */
  byte k;         /* retransmissions left                                 */
  byte x, y, j;   /* scratch                                              */

idle:
  if
  :: atomic {
       ctl[r]?m, a, dt ->
       if
       :: m == PLAN -> m = 0; goto plan
       :: else -> m = 0; a = 0; dt = 0; goto idle  /* abort of nothing held */
       fi
     }
  :: atomic { dend[r] && empty(ctl[r]) -> pend[r] = true; goto fin }
  fi;

plan:
  /* Reserve, compute, seal, transmit: waits while the pool is exhausted; a
     newer control message supersedes the plan meanwhile. */
  if
  :: atomic {
       reserve_prefill(s, r);
       stg = TAG(s, pgen[s]);
       pcont[s] = PAY(r, 0, a);                 /* Pool.Write     */
       pstate[s] = SEALED;                      /* Pool.Seal      */
       send_frame(r, dt, stg, pcont[s]);
       pawait[s] = true;                        /* Pool.AwaitAck  */
#ifdef MUTANT_EARLY_RELEASE
       release_prefill(stg, r);
#endif
       k = RETX_MAX
     }
  :: atomic {
       ctl[r]?m, x, y ->
       if
       :: m == PLAN -> a = x; dt = y; PF_CLEAR; goto plan
       :: else -> a = 0; dt = 0; PF_CLEAR; goto idle
       fi
     }
  fi;

  do
  :: atomic {                                   /* Pool.Ack */
       ack[r]?x ->
       if
       :: x == stg -> release_prefill(stg, r); a = 0; dt = 0; PF_CLEAR; goto idle
       :: else -> x = 0                         /* older tag: refused */
       fi
     }
  :: atomic { k > 0 -> k--; send_frame(r, dt, stg, pcont[s]) }  /* retransmit */
  :: atomic {                                   /* Pool.Tick: deadline */
       release_prefill(stg, r); a = 0; dt = 0; PF_CLEAR; goto idle
     }
  :: atomic {
       ctl[r]?m, x, y ->
       release_prefill(stg, r);
       if
       :: m == PLAN -> a = x; dt = y; PF_CLEAR; goto plan
       :: else -> a = 0; dt = 0; PF_CLEAR; goto idle
       fi
     }
  od;

fin:
  skip
}

/* ----------------------------------------------------------- quiescence */

/* P3: when both requests are over on both sides, every page is free. */
active proctype Quiescence() {
  byte i;
  (dend[0] && dend[1] && pend[0] && pend[1]);
  atomic {
    i = 0;
    do
    :: i < DPAGES -> assert(dstate[i] == FREE && dlease[i] == 0); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < PPAGES -> assert(pstate[i] == FREE); i++
    :: else -> break
    od
  }
}

init {
  atomic {
    run Decode(0); run Prefill(0);
    run Decode(1); run Prefill(1)
  }
}
