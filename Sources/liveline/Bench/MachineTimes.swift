import Foundation

/// The machine's CPU time by kind, summed over its cores: the first line of `/proc/stat` (`cpu  user nice system idle
/// iowait irq softirq steal …`, in clock ticks). Two readings tell what share of the cores' time between them went
/// unused (``idleShare(since:)``): a fan-out round that leaves cores idle is not bound by the CPU alone (on this machine,
/// 13 – 16 % were idle while the engine's jobs shared the push connections' two event loops: see ``LowPriorityEngine``).
struct MachineTimes: Equatable, Sendable {
    /// Ticks the cores ran anything (user, nice, system, irq, softirq).
    var busy: Int
    /// Ticks the cores had nothing to run (idle, and iowait: idle with a disk request outstanding).
    var idle: Int
    /// Ticks a virtual machine's cores were ready but the host ran something else (steal): neither busy here nor idle.
    var stolen: Int

    /// Parses the aggregate `cpu` line of `/proc/stat`; nil when `stat` holds none. Fields after steal (guest time)
    /// are already counted in user and nice, and are left out.
    init?(stat: String) {
        guard let line = stat.split(separator: "\n").first(where: { $0.hasPrefix("cpu ") }) else { return nil }
        let ticks = line.split(separator: " ").dropFirst().prefix(8).compactMap { Int($0) }
        guard ticks.count == 8 else { return nil }
        // user, nice, system, idle, iowait, irq, softirq, steal
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
        idle = ticks[3] + ticks[4]
        stolen = ticks[7]
    }

    init(busy: Int, idle: Int, stolen: Int) {
        self.busy = busy
        self.idle = idle
        self.stolen = stolen
    }

    /// This machine's times now; nil where `/proc/stat` cannot be read (not Linux).
    static func read() -> MachineTimes? {
        guard let text = Bench.procFile("/proc/stat") else { return nil }
        return MachineTimes(stat: text)
    }

    /// The share of the cores' time since `earlier` that was idle (0 – 1); nil when no tick passed.
    func idleShare(since earlier: MachineTimes) -> Double? {
        let idle = self.idle - earlier.idle
        let total = (busy - earlier.busy) + idle + (stolen - earlier.stolen)
        guard total > 0 else { return nil }
        return Double(idle) / Double(total)
    }
}

extension Bench {
    /// A share (0 – 1) as a whole percentage: `12 %`.
    static func percent(_ share: Double) -> String {
        String(format: "%.0f %%", share * 100)
    }
}
