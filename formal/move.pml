/*
 * move.pml: the live move of a running request from one decode node to
 * another, for SPIN. A third model beside handoff.pml and cache.pml: the
 * source decode node S, the target decode node T, and the router's relay R
 * that passes the request's token stream on to the client. The page
 * mechanics (tags, generations, deferred release) are handoff.pml's; here
 * what matters is the three-party hand-over: who holds the sequence's KV,
 * who streams, and what the client sees.
 *
 * Two decode nodes, A and B. The request runs on A, its first chunk passed
 * on to the client, its second on the way. A decoding request may move to
 * the other node (and, with BACK, a request moved to B may move back to
 * A): S pauses, asks T (MoveRequest), T reserves a page and plans
 * (MovePlan), S sends the frame and its report (TransferDone, First = the
 * last token it streamed), T writes, verifies the tag, recomputes the last
 * token from the page, resumes and acknowledges (TransferAck); only then
 * S tells the relay (StreamMoved, after its last chunk), releases its page
 * and ends. The relay hands the stream over once every chunk up to the
 * one named has been passed on, and tells T (StreamTake); T streams from
 * then on. A move that fails (T refuses or aborts, S's deadline) leaves S
 * decoding on.
 *
 * What is proved (exhaustively, within the bounds below):
 *   V1  the sequence is never lost: S releases its page only while T holds
 *       the verified KV of the sequence, waiting for the stream (or T has
 *       crashed); and at every moment until the request ends, one of the
 *       two holds the complete KV, unless a fault intervened (a lost
 *       message, a take later than the target's deadline, the relay's own
 *       deadline, the crash of a node that held the sequence or that the
 *       relay was hearing);
 *   V2  T never accepts a frame aimed at another tenancy of its page (a
 *       stale tag: an earlier move's, under the same owner, so that the
 *       generation alone tells the two apart);
 *   V3  the relay passes on chunks only from the node that holds the
 *       stream, and the client's stream is 1, 2, 3, ... with each chunk's
 *       token the one the reference answer has there: no token lost
 *       between two passed on, none repeated, none replayed, none wrong;
 *       the relay hands the stream over only on the latest hand-over,
 *       never on a late or repeated one;
 *   V4  never do both nodes stream the request; a decode node decodes
 *       only over the page it holds;
 *   V5  at quiescence every page is free (no leak), the relay has
 *       answered, and a run without such a fault ended with the whole
 *       answer: duplicated, reordered and late move messages, refused and
 *       abandoned moves, move deadlines, a rogue's chunk and the crash of
 *       a target before its ack change nothing the client sees.
 *
 * KV is abstract: a page holds a version, the number of tokens streamed
 * whose preceding positions are in it ("every position but the last
 * token's"). A decode node that holds version v streams token v+1 next;
 * tokens are their position in the reference answer (greedy decoding is
 * deterministic), so a token from the wrong KV shows as a wrong number.
 *
 * Planted bugs, each built from this same file with spin -D<name>:
 *   MUTANT_MOVE_RELEASE_BEFORE_ACK  S releases its page once its frame and
 *                                   report are sent, before T's ack;
 *   MUTANT_MOVE_STALE_TAG           T writes a frame into its reserved page
 *                                   whatever the generation of its tag;
 *   MUTANT_RELAY_UNHANDED           the relay takes chunks from any decode
 *                                   node, not only the one the stream is on;
 *   MUTANT_MOVE_REPLAY              T, when the stream is taken, streams
 *                                   the tokens its source had streamed
 *                                   again before its own, in chunks
 *                                   numbered on from the moved one.
 * Each must end in an assertion violation; the model without them must not.
 *
 * See MAPPING.md for the Go code each part stands for and what is left out.
 */

/* ---------------------------------------------------------------- bounds */

#ifndef NTOK
#define NTOK      4  /* tokens of the answer (MaxTokens); 2 streamed at start */
#endif
#ifndef MOVE_MAX
#define MOVE_MAX  2  /* moves asked for, in total                            */
#endif
#ifndef BACK
#define BACK      0  /* 1: a request moved to B may move back to A           */
#endif
#ifndef LOSS_MAX
#define LOSS_MAX  1  /* messages lost                                        */
#endif
#ifndef DUP_MAX
#define DUP_MAX   1  /* messages delivered twice                             */
#endif
#ifndef CRASH_MAX
#define CRASH_MAX 1  /* decode node crashes (A or B, at any moment)         */
#endif
#ifndef FORGE_MAX
#define FORGE_MAX 0  /* chunks a rogue sends                                 */
#endif
#ifndef RTO
#define RTO       0  /* 1: the relay's own deadline may fire at any moment   */
#endif
#ifndef NSLOT
#define NSLOT     12 /* room in the network, never reached (asserted)       */
#endif
/* check.sh's configurations (see MAPPING.md, "Bounds", for why these):
     move:  the defaults: two moves from A, a loss, a duplicate, a crash;
     later: -DNTOK=5 -DLOSS_MAX=0 -DCRASH_MAX=0: A may decode on between
            two moves, so a late frame carries an older version;
     rogue: -DLOSS_MAX=0 -DCRASH_MAX=0 -DFORGE_MAX=1 -DRTO=1: a rogue's
            chunk, a duplicate, the relay's deadline at any moment;
     back:  -DBACK=1 -DMOVE_MAX=3 -DLOSS_MAX=0 -DNSLOT=16: A to B, back
            to A, to B again, a duplicate and a crash. Without rhanded
            (the relay refusing a hand-over made already) SPIN finds a
            trace; see MAPPING.md. */

/* ---------------------------------------------------------------- values */

#define A        0
#define B        1
#define ROGUE    2   /* an address the stream never goes to                  */
#define NONODE   3   /* the relay, as a message's receiver; no node          */

/* A node's actor for the request (one at most: admission refuses a second
   of the same client key). */
#define IDLE     0   /* none                                                 */
#define RESV     1   /* target: page reserved, plan sent, frame awaited      */
#define WAIT     2   /* target: verified, resumed, acked; stream not taken   */
#define LIVE     3   /* decoding with the stream: A's first actor, or a
                        target the relay took the stream to                  */

/* A LIVE actor's move under way. */
#define MV_NONE  0
#define MV_ASKED 1   /* paused, MoveRequest sent, plan awaited               */
#define MV_SENT  2   /* plan taken, frame and report sent, ack awaited       */

/* Page states: WRITTEN is kv's Filling (the frame is in, not yet sealed
   against the source and verified); SEALED covers Sealed and Leased. */
#define FREE     0
#define RESERVED 1
#define WRITTEN  2
#define SEALED   3
#define GEN_MAX  15

#define OK       1
#define ERR      0

/* Message kinds. */
#define K_MREQ   1   /* MoveRequest      S -> T's admission: mid, seq        */
#define K_PLAN   2   /* MovePlan         T -> S: mid, tid, gen, ghost ten    */
#define K_FRAME  3   /* kv frame         S -> T's data plane: gen, version   */
#define K_DONE   4   /* TransferDone     S -> T's tid: OK/ERR, First         */
#define K_ACK    5   /* TransferAck      T -> S: tid                         */
#define K_TABORT 6   /* TransferAbort of T's request  T -> S: tid            */
#define K_REFUSE 7   /* TransferAbort of T's admission T -> S: mid           */
#define K_MOVED  8   /* StreamMoved      S -> R: seq, to, tid                */
#define K_TAKE   9   /* StreamTake       R -> T's tid: seq                   */
#define K_CHUNK  10  /* TokenChunk       node -> R: seq, token, ghost legit  */
#define K_RESULT 11  /* GenerateResult   node -> R: OK/ERR                   */

/* ---------------------------------------------------------------- state */

/* The actor of the request on each node. */
byte st[2];
byte aid[2];     /* its request id: 0 for A's first actor, a tid for a target */
byte seq[2];     /* LIVE: chunks streamed; RESV, WAIT: the move's Seq        */
byte tg[2];      /* the generation its manifest expects of its page          */
byte tt[2];      /* ghost: the tenancy of its page it reserved               */
byte mv[2];      /* LIVE: the move under way                                 */
byte mid[2];     /*       its id                                             */
byte pl[2];      /*       the planner pinned (the target's tid), 0 if none   */
byte sa[2];      /* target: its source's actor, whom its answers address     */

/* Each node's pool: one page (the sequence's, in the move's layout). A
   release bumps the generation; the bytes stay. */
byte pst[2];
byte pgen[2];
byte pver[2];    /* the KV version the page holds                            */
byte pten[2];    /* ghost: tenancy count, moves on every reserve             */

bool crashed[2];

/* The relay (cluster/router.go's relay over handoff.Stream) and the client. */
byte rat;        /* the node the stream is on                                */
bool rleft[3];   /* addresses the stream left                                */
byte rseq;       /* the last chunk passed on                                 */
byte pseq;       /* the StreamMoved waited on: seq, to, tid; pto == NONODE   */
byte pto = NONODE;
byte ptid;
bool rhanded[16];  /* the target requests the stream was handed over to     */
bool rdone;      /* the client has its answer                                */
byte rres;       /* which                                                    */
byte cseq;       /* ghost: the client's last chunk, checked on its own       */

/* The network: an unordered bag, so any message may overtake any other,
   except that chunks of one node arrive in the order it sent them (one
   connection to the relay). A message is packed into one int (kind,
   sending node, receiving node, the actor it is addressed to, the id its
   receiver checks, two fields, a ghost), and the bag is kept sorted,
   largest first, zeros after: two bags holding the same messages are one
   state. */
#define PACK(k,fr,to,ta,id,a,b,g) ((k)*16777216 + (fr)*4194304 + (to)*1048576 + (ta)*65536 + (id)*4096 + (a)*256 + (b)*16 + (g))
#define MK(x)    ((x)/16777216)
#define MFR(x)   (((x)/4194304)%4)
#define MTO(x)   (((x)/1048576)%4)
#define MTA(x)   (((x)/65536)%16)
#define MID(x)   (((x)/4096)%16)
#define MA(x)    (((x)/256)%16)
#define MB(x)    (((x)/16)%16)
#define MG(x)    ((x)%16)
int  bag[NSLOT];
byte inflight;

/* Ids and budgets. */
byte nmid;       /* move ids handed out                                      */
byte ntid;       /* target request ids handed out                            */
byte moves  = MOVE_MAX;
byte losses = LOSS_MAX;
byte dups   = DUP_MAX;
byte crashes = CRASH_MAX;
byte forges = FORGE_MAX;

/* Ghosts. */
byte lastho;     /* tid of the latest hand-over a source made                */
bool fin;        /* the stream's node sent the request's result              */
bool fault;      /* a message lost, a take too late, the relay's deadline,
                    a crash (but see crash)                                  */

/* What the assertions say, by name (so that a violation reads as one);
   false between steps. */
bool target_keeps, this_tenancy, latest_handover, from_stream_node, next_chunk,
     right_token, own_page, one_streams, kept, no_leak, whole_answer;

/* ------------------------------------------------------------- messages */

/* Put a message in flight, in its place in the sorted bag. Never blocks,
   so it can sit inside an atomic step. NSLOT is a bound of the model, not
   of the network: a send beyond it is an error of the model (raise NSLOT). */
byte sj, rj;     /* scratch of send, of gc and of the replay; 0 between steps */
int  sval;

inline send(mk, mfr, mto, mta, mid_, ma, mb, mg) {
  assert(inflight < NSLOT);
  sval = PACK(mk, mfr, mto, mta, mid_, ma, mb, mg);
  sj = inflight;
  do
  :: sj > 0 && bag[sj - 1] < sval -> bag[sj] = bag[sj - 1]; sj--
  :: else -> break
  od;
  bag[sj] = sval; inflight++;
  sj = 0; sval = 0
}

/* A message no receiver will ever see: for the relay once it has answered
   and stopped, for a node that crashed, for an actor that has ended (the
   transport drops a message to a stopped actor, as it drops a frame for a
   request id nobody has). Its delivery would be a no-op whenever it came,
   so it is dropped at once: states that differ only in such messages are
   one state, and the bag keeps room for those that matter. A message to a
   live actor is kept, however late, and the actor's own checks refuse it.
   Frames carry no actor (they name the request's pages; see V2) and are
   never dropped this way. */
#define DEAD(v) ( \
  ((MK(v) == K_CHUNK || MK(v) == K_MOVED || MK(v) == K_RESULT) && rdone) || \
  (MK(v) != K_CHUNK && MK(v) != K_MOVED && MK(v) != K_RESULT && crashed[MTO(v)]) || \
  ((MK(v) == K_PLAN || MK(v) == K_ACK || MK(v) == K_TABORT || MK(v) == K_REFUSE) && \
     !(st[MTO(v)] == LIVE && aid[MTO(v)] == MTA(v))) || \
  ((MK(v) == K_DONE || MK(v) == K_TAKE) && !(st[MTO(v)] != IDLE && aid[MTO(v)] == MTA(v))))

inline gc() {
  sj = 0;
  do
  :: sj < inflight ->
       if
       :: DEAD(bag[sj]) ->
            rj = sj;
            do
            :: rj + 1 < inflight -> bag[rj] = bag[rj + 1]; rj++
            :: else -> break
            od;
            bag[inflight - 1] = 0; inflight--; rj = 0
       :: else -> sj++
       fi
  :: else -> break
  od;
  sj = 0
}

/* Take message j out of the bag, closing the gap. */
inline drop_msg(j) {
  do
  :: j + 1 < inflight -> bag[j] = bag[j + 1]; j++
  :: else -> break
  od;
  bag[inflight - 1] = 0; inflight--
}

/* ------------------------------------------------------------ page steps */

#define HOLDS(n) (pst[n] == SEALED && pten[n] == tt[n] && pgen[n] == tg[n] && pver[n] == seq[n])

/* What a node holds of the sequence: LIVE over its page, or a target that
   verified and waits for the stream. */
#define KEEPS(n) ((st[n] == LIVE || st[n] == WAIT) && HOLDS(n))

inline free_page(n) {
  pst[n] = FREE;
  assert(pgen[n] < GEN_MAX); pgen[n]++
}

/* Release by the actor on n: only its own tenancy, under the tag it holds. */
inline release(n) {
  if
  :: pst[n] != FREE && pgen[n] == tg[n] && pten[n] == tt[n] -> free_page(n)
  :: else -> skip                               /* stale: refused */
  fi
}

/* V1: the source lets its page go only while the target holds the
   verified sequence and waits for the stream, or is gone. */
inline release_source(n) {
  target_keeps = crashed[1 - n] || (st[1 - n] == WAIT && pl[n] == aid[1 - n] && HOLDS(1 - n));
  assert(target_keeps);                         /* V1 */
  target_keeps = false;
  release(n)
}

inline clear_actor(n) {
  st[n] = IDLE; aid[n] = 0; seq[n] = 0; tg[n] = 0; tt[n] = 0;
  mv[n] = MV_NONE; mid[n] = 0; pl[n] = 0; sa[n] = 0
}

/* ------------------------------------------------------------ the source */

/* moveFailed: the move ends, the job resumes; a target that planned is
   told (a TransferDone with its error). */
inline move_failed(n, tell) {
  one_streams = (st[1 - n] != LIVE);
  assert(one_streams);                          /* V4 */
  one_streams = false;
  if
  :: tell && pl[n] != 0 -> send(K_DONE, n, 1 - n, pl[n], pl[n], ERR, 0, 0)
  :: else -> skip
  fi;
  mv[n] = MV_NONE; mid[n] = 0; pl[n] = 0
}

/* The plan of the move under way: send the page's frame to the planned
   tag, then the report naming the last token streamed. */
inline plan_in(n, ptid_, gen, ten) {
  pl[n] = ptid_;
  send(K_FRAME, n, 1 - n, 0, 0, gen, pver[n], ten);
  send(K_DONE, n, 1 - n, ptid_, ptid_, OK, seq[n], 0);
  mv[n] = MV_SENT;
#ifdef MUTANT_MOVE_RELEASE_BEFORE_ACK
  release(n)
#else
  skip
#endif
}

/* The target's ack: hand over (StreamMoved after the last chunk), let the
   page go, end as moved. */
inline ack_in(n) {
  lastho = pl[n];
  send(K_MOVED, n, NONODE, 0, pl[n], seq[n], 1 - n, 0);
#ifndef MUTANT_MOVE_RELEASE_BEFORE_ACK
  release_source(n);
#endif
  clear_actor(n)
}

/* The stream's node ends the request: the whole answer, its page released. */
inline finish_ok(n) {
  release(n);
  send(K_RESULT, n, NONODE, 0, 0, OK, 0, 0);
  fin = true;
  clear_actor(n)
}

/* ------------------------------------------------------------ the target */

/* The target's request ends before the stream is taken: silently, its page
   released, the source told (TransferAbort of the target's request). */
inline target_end(n) {
  release(n);
  send(K_TABORT, n, 1 - n, sa[n], aid[n], 0, 0, 0);
  clear_actor(n)
}

/* Admission of a MoveRequest (mid, the Seq moved, the source's actor): a
   second actor for the request is refused (the admission's client key),
   the refusal naming the move. Otherwise the target's request reserves
   the page (free: nothing else uses this pool) and plans. */
inline move_in(n, m, s, src) {
  if
  :: st[n] != IDLE -> send(K_REFUSE, n, 1 - n, src, m, 0, 0, 0)
  :: else ->
       assert(pst[n] == FREE);
       ntid++; aid[n] = ntid; st[n] = RESV; seq[n] = s; sa[n] = src;
       pst[n] = RESERVED; pten[n]++; tt[n] = pten[n]; tg[n] = pgen[n];
       send(K_PLAN, n, 1 - n, src, m, aid[n], pgen[n], pten[n])
  fi
}

/* The data plane's receiver: a frame is written only into a page reserved
   by a target waiting for frames, under the current generation. */
#ifdef MUTANT_MOVE_STALE_TAG
#define GEN_OK(n, gen) true
#else
#define GEN_OK(n, gen) (pgen[n] == (gen))
#endif

inline frame_in(n, gen, ver, ten) {
  if
  :: st[n] == RESV && pst[n] == RESERVED && GEN_OK(n, gen) ->
       this_tenancy = (ten == pten[n]);
       assert(this_tenancy);                    /* V2 */
       this_tenancy = false;
       pver[n] = ver; pst[n] = WRITTEN
  :: else -> skip                               /* StaleTagError, dropped */
  fi
}

/* The source's report: a failure ends the target; a success is checked
   (the frame is in, the tag current, First the move's last token), the
   page sealed, the last token recomputed from it (StartDecode.Resume),
   and only then acknowledged. */
inline done_in(n, ok, first) {
  if
  :: st[n] == RESV && ok == ERR -> target_end(n)
  :: st[n] == RESV && ok == OK ->
       if
       :: pst[n] == WRITTEN && pgen[n] == tg[n] && first == seq[n] && pver[n] == first ->
            pst[n] = SEALED; st[n] = WAIT;
            send(K_ACK, n, 1 - n, sa[n], aid[n], 0, 0, 0)
       :: else -> target_end(n)                 /* ManifestError, FirstTokenError */
       fi
  :: st[n] == WAIT && ok == ERR -> target_end(n) /* the source decodes on */
  :: else -> skip                               /* duplicate */
  fi
}

/* The relay's StreamTake: at the chunk the move named, the stream is the
   target's; at another, the request fails (TakeError), its answer to the
   relay. */
inline take_in(n, s) {
  if
  :: s == seq[n] ->
       one_streams = (st[1 - n] != LIVE);
       assert(one_streams);                     /* V4 */
       one_streams = false;
       st[n] = LIVE; mv[n] = MV_NONE
#ifdef MUTANT_MOVE_REPLAY
       ;
       rj = 1;                                  /* the source's tokens again */
       do
       :: rj <= s && seq[n] < NTOK ->
            seq[n]++; pver[n]++; send(K_CHUNK, n, NONODE, 0, 0, seq[n], rj, 1); rj++
       :: else -> break
       od;
       rj = 0
#endif
  :: else ->
       release(n);
       send(K_RESULT, n, NONODE, 0, 0, ERR, 0, 0);
       fin = true;
       clear_actor(n)
  fi
}

/* ------------------------------------------------------------- the relay */

/* Stream.From: only the node the stream is on; a node it left is dropped
   quietly, any other refused. An answered relay drops everything. */
#ifdef MUTANT_RELAY_UNHANDED
#define FROM_OK(f) (!rdone)
#else
#define FROM_OK(f) (!rdone && !rleft[f] && (f) == rat)
#endif

/* Stream.HandOver: once every chunk up to the moved one is passed on. */
inline hand_over() {
  if
  :: pto != NONODE && rseq == pseq ->
       latest_handover = (ptid == lastho);
       assert(latest_handover);                 /* V3 */
       latest_handover = false;
       rhanded[ptid] = true;
       rleft[rat] = true; rleft[pto] = false; rat = pto;
       send(K_TAKE, NONODE, pto, ptid, ptid, rseq, 0, 0);
       pseq = 0; pto = NONODE; ptid = 0
  :: else -> skip
  fi
}

inline chunk_in(f, s, tok, legit) {
  if
  :: FROM_OK(f) && s == rseq + 1 ->
       from_stream_node = legit;
       next_chunk = (s == cseq + 1);
       right_token = (tok == s);
       assert(from_stream_node);                /* V3 */
       assert(next_chunk);                      /* V3: in order, no gap, once */
       assert(right_token);                     /* V3 */
       from_stream_node = false; next_chunk = false; right_token = false;
       cseq = s; rseq = s;
       hand_over()
  :: else -> skip                               /* refused or dropped */
  fi
}

inline moved_in(f, s, to_, mtid) {
  if
  :: FROM_OK(f) && s >= rseq && pto == NONODE && !rhanded[mtid] ->
       pseq = s; pto = to_; ptid = mtid;
       hand_over()
  :: else -> skip                               /* refused or dropped */
  fi
}

inline result_in(f, ok) {
  if
  :: FROM_OK(f) -> rdone = true; rres = ok
  :: else -> skip
  fi
}

/* ----------------------------------------------------------- delivery */

/* Deliver message v to its receiver: one actor message, one atomic step.
   A message to a crashed node, or to an actor that is not there (a
   request id nobody has now), is dropped. */
inline deliver(v) {
  k = MK(v); f = MFR(v); t = MTO(v); m = MID(v); x = MA(v); y = MB(v); z = MG(v);
  if
  :: k == K_CHUNK  -> chunk_in(f, x, y, z)
  :: k == K_MOVED  -> moved_in(f, x, y, m)
  :: k == K_RESULT -> result_in(f, x)
  :: k != K_CHUNK && k != K_MOVED && k != K_RESULT && crashed[t] -> skip
  :: k == K_MREQ && !crashed[t] -> move_in(t, m, x, y)
  :: k == K_PLAN && !crashed[t] ->
       if
       :: st[t] == LIVE && mv[t] == MV_ASKED && mid[t] == m -> plan_in(t, x, y, z)
       :: else -> skip                          /* another move's, late, a duplicate */
       fi
  :: k == K_FRAME && !crashed[t] -> frame_in(t, x, y, z)
  :: k == K_DONE && !crashed[t] ->
       if
       :: st[t] != IDLE && aid[t] == m -> done_in(t, x, y)
       :: else -> skip
       fi
  :: k == K_ACK && !crashed[t] ->
       if
       :: st[t] == LIVE && mv[t] == MV_SENT && pl[t] == m -> ack_in(t)
       :: else -> skip                          /* an abandoned move's, late */
       fi
  :: k == K_TABORT && !crashed[t] ->
       if                                       /* the target ended it */
       :: st[t] == LIVE && mv[t] == MV_SENT && pl[t] == m -> move_failed(t, false)
       :: else -> skip
       fi
  :: k == K_REFUSE && !crashed[t] ->
       if                                       /* the target's admission refused */
       :: st[t] == LIVE && mv[t] == MV_ASKED && mid[t] == m -> move_failed(t, false)
       :: else -> skip
       fi
  :: k == K_TAKE && !crashed[t] ->
       if
       :: st[t] == WAIT && aid[t] == m -> take_in(t, x)
       :: else -> skip                          /* duplicate, or nobody */
       fi
  fi;
  k = 0; f = 0; t = 0; m = 0; x = 0; y = 0; z = 0
}

/* A chunk waits behind an earlier chunk of the same node, and a result
   behind every chunk of its node: one connection to the relay, and the
   relay takes a result after the chunks before it. A rogue's chunk comes
   on a connection of its own; a StreamMoved is not ordered with chunks. */
inline may_deliver(v, ok) {
  ok = true;
  if
  :: (MK(v) == K_CHUNK && MFR(v) != ROGUE) || MK(v) == K_RESULT ->
       i = 0;
       do
       :: i < inflight ->
            if
            :: MK(bag[i]) == K_CHUNK && MFR(bag[i]) == MFR(v) &&
               (MK(v) == K_RESULT || MA(bag[i]) < MA(v)) -> ok = false
            :: else -> skip
            fi;
            i++
       :: else -> break
       od;
       i = 0
  :: else -> skip
  fi
}

/* Any message in flight. */
inline pick(j) {
  j = 0;
  do
  :: j + 1 < inflight -> j++
  :: break
  od
}

/* Deliver message jj, unless it must wait behind another; with keep, a
   copy stays in flight (a duplicate). */
inline net_deliver(jj, keep) {
  v = bag[jj]; may_deliver(v, ok);
  if
  :: ok && keep -> dups--
  :: ok && !keep -> j = jj; drop_msg(j)
  :: else -> skip
  fi;
  if
  :: ok -> deliver(v)
  :: else -> skip
  fi;
  j = 0; v = 0; ok = false; cp = false
}

/* Lose message jj. */
inline net_lose(jj) {
  j = jj; drop_msg(j); losses--; fault = true; j = 0
}

/* The network delivers any message in flight at any time (reordering,
   delay), may lose one (LOSS_MAX) and deliver one twice, the copy staying
   in flight to arrive again later (DUP_MAX). Each step handles one message
   whole, as one actor message is handled at a time. */
proctype Network() {
  byte j, i, k, f, t, m, x, y, z;
  int v;
  bool ok, cp;
end_net:
  do
  :: atomic {
       inflight > 0 -> pick(j);
       if
       :: dups > 0 -> cp = true                 /* duplication */
       :: true                                  /* delivery */
       fi;
       d_step { net_deliver(j, cp); gc() } }
  :: atomic { losses > 0 && inflight > 0 -> pick(j); d_step { net_lose(j); gc() } }
  od
}

/* ------------------------------------------------------------ the nodes */

/* The source still waits for the ack of the target on n. */
#ifdef TAKE_ANYTIME
#define AWAITED(n) false
#else
#define AWAITED(n) (st[1 - (n)] == LIVE && mv[1 - (n)] == MV_SENT && pl[1 - (n)] == aid[n])
#endif

/* The steps the actor on node n takes of its own: decode, move out, and
   its deadlines. */
proctype Node(byte n) {
end_node:
  do
  /* A decode step of the stream's node: one token, one chunk. */
  :: d_step {
       st[n] == LIVE && mv[n] == MV_NONE && seq[n] < NTOK ->
       own_page = HOLDS(n);
       assert(own_page);                        /* V4 */
       own_page = false;
       seq[n]++; pver[n]++;
       send(K_CHUNK, n, NONODE, 0, 0, seq[n], pver[n], 1);
       if
       :: seq[n] == NTOK -> finish_ok(n)
       :: else -> skip
       fi;
       gc() }
  /* MoveOut (Movable: decoding, two tokens or more left, no move under
     way): pause, and ask the other node. */
  :: d_step {
       st[n] == LIVE && mv[n] == MV_NONE && seq[n] < NTOK - 1 && moves > 0 && (n == A || BACK) ->
       moves--; nmid++; mid[n] = nmid; mv[n] = MV_ASKED;
       send(K_MREQ, n, 1 - n, 0, mid[n], seq[n], aid[n], 0); gc() }
  /* MoveDeadline, or PeerLost of the target: decode on here. */
  :: d_step { st[n] == LIVE && mv[n] != MV_NONE -> move_failed(n, true); gc() }
  /* PrefillDeadline, or PeerLost of the source: the target ends. */
  :: d_step { st[n] == RESV -> target_end(n); gc() }
  /* TakeDeadline. Its timer starts at the ack, the source's move deadline
     (as long) at the pause before it: the source is past its deadline, or
     has the ack, or is gone, by the time it fires. It is a fault (a late
     take) only for the target the source handed the stream to; for one the
     source gave up on, it is how that target ends. */
  :: d_step { st[n] == WAIT && !AWAITED(n) -> fault = fault || lastho == aid[n]; target_end(n); gc() }
  od
}

/* ------------------------------------------------------- relay deadlines */

/* memberLost of the node the stream is on; the relay's own deadline (with
   RTO, at any moment); and, when nothing else in the whole system can move
   while the client waits, that deadline too: a stuck request. */
proctype Relay() {
end_relay:
  do
  :: d_step { !rdone && crashed[rat] -> rdone = true; rres = ERR; gc() }
#if RTO
  :: d_step { !rdone -> rdone = true; rres = ERR; fault = true; gc() }
#endif
  :: atomic { timeout && !rdone -> rdone = true; rres = ERR; gc() }
  od
}

/* ----------------------------------------------------- crashes, a rogue */

/* A crash of either node at any moment: its actor and pool are gone; what
   it sent is still in flight. It is a fault, except the crash of a node
   that has not acknowledged a move while the other streams and the relay
   hears it: a crash of a target before its ack, or of a node the stream
   has left; then the request must still end with the whole answer. A rogue's chunk: the request's id, the next
   number, the wrong token, from a decode node the stream never went to (a
   peer with a certificate of the cluster's CA; request ids and chunk
   numbers are no secret). Either may stop being possible at any time, so
   that a stuck run is seen as stuck. */
inline crash(n) {
  crashes--; crashed[n] = true;
  fault = fault || !(rat == 1 - n && st[1 - n] == LIVE && st[n] != WAIT);
  clear_actor(n)
}

proctype Faults() {
end_faults:
  do
  :: d_step { crashes > 0 && !crashed[A] -> crash(A); gc() }
  :: d_step { crashes > 0 && !crashed[B] -> crash(B); gc() }
  :: d_step { forges > 0 && !rdone -> forges--; send(K_CHUNK, ROGUE, NONODE, 0, 0, rseq + 1, 0, 0) }
  :: d_step { crashes > 0 || forges > 0 -> crashes = 0; forges = 0 }
  od
}

/* ------------------------------------------------------------- monitors */

/* V1, V4 at every moment: one node keeps the sequence until the request
   ends (or a fault intervened); never do both nodes stream it. */
proctype Kept() {
end_kept:
  atomic {
    (!(rdone || fin || fault || KEEPS(A) || KEEPS(B)) || (st[A] == LIVE && st[B] == LIVE)) ->
    kept = rdone || fin || fault || KEEPS(A) || KEEPS(B);
    one_streams = !(st[A] == LIVE && st[B] == LIVE);
    assert(kept);                               /* V1 */
    assert(one_streams)                         /* V4 */
  }
}

/* V5: once the client has its answer and nothing is left anywhere, every
   page is free, and a run without crash, loss or late take has the whole
   answer, every chunk in order. */
proctype Quiescence() {
  (rdone && st[A] == IDLE && st[B] == IDLE && inflight == 0);
  atomic {
    no_leak = (crashed[A] || pst[A] == FREE) && (crashed[B] || pst[B] == FREE);
    whole_answer = fault || (rres == OK && cseq == NTOK);
    assert(no_leak);                            /* V5 */
    assert(whole_answer)                        /* V5 */
  }
}

init {
  atomic {
    /* A's first actor: decoding, two chunks streamed, the first passed on,
       the second on its way. */
    st[A] = LIVE; aid[A] = 0; seq[A] = 2;
    pst[A] = SEALED; pten[A] = 1; tt[A] = 1; tg[A] = 0; pver[A] = 2;
    rat = A; rseq = 1; cseq = 1;
    send(K_CHUNK, A, NONODE, 0, 0, 2, 2, 1);
    run Network(); run Node(A); run Node(B); run Relay(); run Faults();
    run Kept(); run Quiescence()
  }
}
