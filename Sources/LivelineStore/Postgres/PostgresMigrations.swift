enum PostgresMigrations {
    static let all: [Migration] = []
}
